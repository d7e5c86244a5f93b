"""The generic web pieces every app uses, below all of them: query parameters read strictly (params),
lists' filters and cursors built on them (filters, pagination), the CSV writer that neutralises
formulas (csv_safe) and the password rule Django's validators miss (passwords).

It imports none of the apps. Roles, API tokens and the admin site by role are accounts', the app just
above this one.
"""
