"""Who may do what: the roles (Django groups of the same names), the API tokens that carry one, the
checks views and the API make with them, and the admin site by role.

It records nothing: granting a role, making or revoking a token and signing in are audit events,
written by audit's services and signal receivers, which call into this app (never the other way).
"""
