from .roles import request_roles


def roles(request):
    """The roles of the signed-in user, for navigation (the views check them again)."""
    held = request_roles(request) if getattr(request, "user", None) is not None else set()
    return {
        "roles": held,
        "is_auditor": bool(held & {"auditor", "admin"}),
        "is_operator": bool(held & {"operator", "admin"}),
        "is_ml_staff": bool(held & {"ml_staff", "admin"}),
    }
