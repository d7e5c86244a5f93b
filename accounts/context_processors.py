"""The signed-in user's roles, for the templates' navigation."""

from .roles import request_roles


def roles(request):
    """The roles of the signed-in user, for navigation (the views check them again)."""
    held = request_roles(request) if getattr(request, "user", None) is not None else set()
    return {
        "roles": held,
        "role_names": sorted(held),
        # Signed in without any role: every page but logging out answers 403, so none is linked.
        "has_any_role": bool(held),
        "is_auditor": bool(held & {"auditor", "admin"}),
        "is_operator": bool(held & {"operator", "admin"}),
        "is_ml_staff": bool(held & {"ml_staff", "admin"}),
    }
