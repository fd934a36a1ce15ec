"""Settings, read from the environment through one reader (django-environ).

Every value a deployment may change comes from an environment variable. The defaults are safe to
serve: DEBUG is off unless DEBUG=true, and SECRET_KEY, when not set, is a random key made once and kept
in the data dir (artweb.bootstrap).
"""

import warnings
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from artweb.bootstrap import LOOPBACK_HOSTS, is_loopback_host, secret_key_load_or_create, secret_key_path

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=False)
DATA_DIR = Path(env.str("ARTWEB_DATA_DIR", default=str(BASE_DIR / "data"))).resolve()

# Signs sessions and tokens, and (through a derived key) encrypts the stored export and judge secrets.
# Unset: DATA_DIR/secret_key, made at random on first use (mode 0600); every process that shares the
# database must see the same key, so a deployment over several hosts sets it. To rotate: set the new
# key, list the old one in SECRET_KEY_FALLBACKS (comma-separated), and run `manage.py rotate_secrets`
# (the launcher runs it at every start); then drop the fallback.
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    try:
        SECRET_KEY = secret_key_load_or_create(DATA_DIR)
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(
            f"SECRET_KEY is not set, and the key file {secret_key_path(DATA_DIR)} cannot be used: {exc}. "
            "Set SECRET_KEY to a long random string, e.g. "
            "SECRET_KEY=$(python -c 'import secrets; print(secrets.token_urlsafe(50))')"
        ) from None
SECRET_KEY_FALLBACKS = env.list("SECRET_KEY_FALLBACKS", default=[])

# "testserver" is the name Django's test client sends, from inside the process.
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=[*LOOPBACK_HOSTS, "testserver"])
# Every name the site answers to reaches this machine only (ALLOWED_HOSTS as `make run` sets it, or left
# at its default).
LOCAL_ONLY = all(is_loopback_host(host) or host == "testserver" for host in ALLOWED_HOSTS)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "channels",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI files served locally: the docs page works offline
    "artweb",
    "rollouts",
    "training",
    "training.serving",
    "training.client_runs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files straight from the ASGI server: no separate web server in front is needed.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: it turns a sign-in refused for too many failures into the lockout page (artweb.auth).
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "artweb.urls"
ASGI_APPLICATION = "artweb.asgi.application"
WSGI_APPLICATION = None

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
                "artweb.visibility.visibility_context",
            ],
        },
    },
]

# PostgreSQL only: the launcher exports DATABASE_URL for the embedded server when none is configured.
DATABASES = {"default": env.db_url("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/artweb")}
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=60))
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Parallel test sessions on one server need distinct test databases.
DATABASES["default"]["TEST"] = {"NAME": env.str("ARTWEB_TEST_DB_NAME", default="test_artweb")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # channels_redis blocks on BZPOPMIN for 5 s; redis-py's own 5 s socket timeout would cut it off.
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
            "prefix": env.str("ARTWEB_CHANNEL_PREFIX", default="artweb"),
        },
    }
}

# JSON, never pickle: whoever can write to Redis must not get to run code in the web process.
CACHES = {
    "default": {
        "BACKEND": "artweb.cache.JsonRedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"serializer": "artweb.cache.JsonSerializer"},
    }
}

# Celery: two queues. "gpu" workers run with concurrency 1 and prefetch 1 (one run step at a time).
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600)}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("ARTWEB_STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
STATICFILES_DIRS = [("frontend", BASE_DIR / "frontend")]
MEDIA_ROOT = DATA_DIR / "uploads"
# Uploads are user code and data: readable by the server's own user only (the launcher's umask agrees).
FILE_UPLOAD_PERMISSIONS = 0o600
FILE_UPLOAD_DIRECTORY_PERMISSIONS = 0o700
# Every JSON body (API, forms, uploads' lines) is refused with a 400 naming this limit when its arrays and
# objects nest deeper (rollouts.sandbox.jsonsafe): Python's parser would recurse into a stack overflow.
ARTWEB_MAX_JSON_DEPTH = env.int("ARTWEB_MAX_JSON_DEPTH", default=64)
# Bodies over this are refused by artweb.asgi before Django reads them (413). Above the largest upload
# (a 20 MiB scenario file, 30 MiB as a JSON body); DATA_UPLOAD_MAX_MEMORY_SIZE still limits form fields.
ARTWEB_MAX_REQUEST_MB = env.int("ARTWEB_MAX_REQUEST_MB", default=32)
# Rollout bundles (rollouts.sandbox.bundles): a zip's files together, uncompressed, and how many files it may hold.
# The zip itself also has to fit in a request (ARTWEB_MAX_REQUEST_MB).
ARTWEB_BUNDLE_MAX_MB = env.int("ARTWEB_BUNDLE_MAX_MB", default=50)
ARTWEB_BUNDLE_MAX_FILES = env.int("ARTWEB_BUNDLE_MAX_FILES", default=500)
# Data attachments (rollouts.sandbox.attachments): the largest file, in MiB. Their upload routes take request bodies
# up to this (artweb.request_size), every other route keeps ARTWEB_MAX_REQUEST_MB.
ARTWEB_ATTACHMENT_MAX_MB = env.int("ARTWEB_ATTACHMENT_MAX_MB", default=2048)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Production serves the collectstatic output (the launcher and the Docker image run it), compressed
    # and with hashed names (cache forever), and a file not collected under its plain name from the source
    # (the finders below), so a checkout that never ran collectstatic (the tests) serves pages too.
    # Development serves the source files as they are.
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "artweb.staticfiles.CollectedStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = True
# Until collectstatic has run, STATIC_ROOT does not exist and the finders serve everything.
warnings.filterwarnings("ignore", message="No directory at: ", module="whitenoise.base")
WHITENOISE_AUTOREFRESH = DEBUG
# WhiteNoise hands Django a synchronous file iterator; under ASGI Django reads it in a thread and warns
# once per process. The files are small static assets, so the warning says nothing useful here.
warnings.filterwarnings("ignore", message="StreamingHttpResponse must consume synchronous iterators")

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# Failed sign-ins (the login form, the admin, HTTP Basic on the token endpoint) lock that username from
# that address out for a while (django-axes). Its backend needs the request: sign tests in with
# force_login, or client.login(request=HttpRequest(), ...).
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env.int("ARTWEB_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("ARTWEB_LOGIN_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "artweb.auth.lockout_response"
# The peer's address, REMOTE_ADDR, only: the ASGI server replaces it with X-Forwarded-For only when the
# peer is a proxy the operator listed (the launcher's ARTWEB_TRUSTED_PROXIES, none by default); reading
# that header here would let a client pick a fresh address for every guess.
AXES_CLIENT_IP_CALLABLE = "artweb.auth.client_ip"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "artweb.api_errors.exception_handler",
    # Throttles key anonymous clients on REMOTE_ADDR; with NUM_PROXIES unset DRF would take X-Forwarded-For.
    "NUM_PROXIES": 0,
    "DEFAULT_THROTTLE_RATES": {
        "writes": env.str("ARTWEB_THROTTLE_WRITES", default="120/min"),
        "uploads": env.str("ARTWEB_THROTTLE_UPLOADS", default="30/min"),
        "runs": env.str("ARTWEB_THROTTLE_RUNS", default="30/min"),
        "tokens": env.str("ARTWEB_THROTTLE_TOKENS", default="10/min"),
        # Chat completions on the OpenAI endpoint, per user (an ART client's own rollouts are not counted).
        "endpoint": env.str("ARTWEB_THROTTLE_ENDPOINT", default="600/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "artweb API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Two models have a "status" choice set and two a "kind" one; named here, the schema gets stable enum
    # names (and `check --deploy` no warning).
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "training.models.Run.Status",
        "DryRunStatusEnum": "training.models.DryRun.Status",
        "RewardKindEnum": "rollouts.models.RewardFunction.Kind",
        "ExportKindEnum": "training.models.ExportTarget.Kind",
    },
}

# Training infrastructure.
ARTWEB = {
    # Python interpreter that runs the vLLM server (may live in its own environment).
    "VLLM_PYTHON": env.str("ARTWEB_VLLM_PYTHON", default=""),
    "VLLM_PORT": env.int("ARTWEB_VLLM_PORT", default=8100),
    "VLLM_EXTRA_ARGS": env.str("ARTWEB_VLLM_EXTRA_ARGS", default=""),
    # The GPUs the inference server runs on (its CUDA_VISIBLE_DEVICES), e.g. "1" on a two-GPU host whose
    # worker trains on ARTWEB_DEVICE=cuda:0; empty: the worker's own.
    "VLLM_CUDA_DEVICES": env.str("ARTWEB_VLLM_CUDA_DEVICES", default=""),
    # Eager mode skips graph compilation: minutes faster to start on CPU, slower to generate.
    "VLLM_ENFORCE_EAGER": env.bool("ARTWEB_VLLM_ENFORCE_EAGER", default=False),
    # None: 0.25 GiB on a CPU (a step of 24 rollouts of the default model uses ~60 MB of it; the whole cache
    # is resident in the worker's tree from the server's start), 2 on a GPU. Fractions allowed.
    "VLLM_KV_CACHE_GB": env.float("ARTWEB_VLLM_KV_CACHE_GB", default=None),
    # "auto": merged weights on the CPU build, runtime LoRA on GPU (see rollouts.inference.vllm_server).
    "VLLM_ADAPTER_MODE": env.str("ARTWEB_VLLM_ADAPTER_MODE", default="auto"),
    # The inference server of a CPU worker: "auto" (measured per processor, rollouts.inference.cpu_probe),
    # "vllm" or "ctranslate2". A GPU worker runs vLLM unless told otherwise.
    "INFERENCE_ENGINE": env.str("ARTWEB_INFERENCE_ENGINE", default="auto"),
    "TRAINER_BACKEND": env.str("ARTWEB_TRAINER_BACKEND", default="peft"),
    # The runs whose training state (LoRA, optimizer, schedule) a GPU worker keeps between their steps, the
    # one loaded included: runs that load the same model share one copy of its weights and switch in
    # milliseconds; a run beyond it (or when memory runs short) resumes from its checkpoint instead.
    "RUNS_PER_WORKER": env.int("ARTWEB_RUNS_PER_WORKER", default=4),
    "DEVICE": env.str("ARTWEB_DEVICE", default="cpu"),
    "HEARTBEAT_SECONDS": env.int("ARTWEB_HEARTBEAT_SECONDS", default=15),
    # How often a worker sweeps for stale runs and owed messages (training.sweeper); 0 turns it off.
    "SWEEP_SECONDS": env.float("ARTWEB_SWEEP_SECONDS", default=10.0),
    # How user code is isolated (rollouts.sandbox.jail): "jail" (bubblewrap + cgroups; the worker must run
    # as root) or "insecure-no-jail", a development opt-out that leaves the worker ownable by any script
    # and marks every run that uses it with a warning event.
    "SANDBOX": env.str("ARTWEB_SANDBOX", default="jail"),
    # The uids user code runs as outside its namespace, "FIRST-LAST": one per batch running at once on the
    # host, leased from here; no account's, neither root nor the worker's. ARTWEB_SANDBOX_UID (deprecated)
    # is read as a range of that one uid.
    "SANDBOX_UIDS": env.str("ARTWEB_SANDBOX_UIDS", default="") or env.str("ARTWEB_SANDBOX_UID", default="64000-64999"),
    # Where the workers of one host hold their uid leases (a directory only root may write; shared by every
    # worker container of the host that uses the same uids).
    "SANDBOX_UID_LOCKS": env.str("ARTWEB_SANDBOX_UID_LOCKS", default="/run/artweb-sandbox-uids"),
    # A delegated cgroup v2 directory for the batches' limits; empty: the host's hierarchy (root only).
    "SANDBOX_CGROUP": env.str("ARTWEB_SANDBOX_CGROUP", default=""),
    # The OpenAI-compatible endpoint (training.serving): how long a request may wait for a worker
    # and its answer, and how many adapters each worker keeps ready (LRU).
    "SERVE_TIMEOUT_SECONDS": env.float("ARTWEB_SERVE_TIMEOUT_SECONDS", default=600.0),
    "SERVE_ADAPTERS": env.int("ARTWEB_SERVE_ADAPTERS", default=4),
    # How many of its requests a worker serves at once: vLLM answers them as one batch (an ART client
    # sends its rollouts 16-64 at a time). Each takes a thread of the worker and a slot in vLLM's batch.
    "SERVE_CONCURRENCY": env.int("ARTWEB_SERVE_CONCURRENCY", default=64),
    # A worker whose inference server holds one policy at a time (merged mode: the CPU default) answers the
    # endpoint on a second server of its own, so that requests never wait for a step
    # (training.services.serving_server): the cores it computes on (None: a quarter of them, at least one;
    # 0: no second server, requests wait for the steps), and the memory it is counted as taking (None:
    # estimated from the model, ~3 GiB for the default one on vLLM's CPU build); it starts only where that
    # much and 1 GiB more is available.
    "SERVE_THREADS": env.int("ARTWEB_SERVE_THREADS", default=None),
    "SERVE_SERVER_GB": env.float("ARTWEB_SERVE_SERVER_GB", default=None),
}
if ARTWEB["SERVE_THREADS"] is not None and not 0 <= ARTWEB["SERVE_THREADS"] <= 4096:
    raise ImproperlyConfigured(
        f"ARTWEB_SERVE_THREADS={ARTWEB['SERVE_THREADS']}: give the cores the endpoint's own inference server "
        "computes on, from 1 to the worker's cores, 0 for none (requests then wait for the steps), or leave it unset."
    )
if ARTWEB["SERVE_SERVER_GB"] is not None and not 0 <= ARTWEB["SERVE_SERVER_GB"] <= 100_000:
    raise ImproperlyConfigured(
        f"ARTWEB_SERVE_SERVER_GB={ARTWEB['SERVE_SERVER_GB']:g}: give the GiB of memory the endpoint's own inference "
        "server takes, fractions allowed, from 0 to 100000, or leave it unset to have it estimated from the model."
    )

# The site is served over plain HTTP, with no TLS in front. By default, when it answers to loopback names
# only (`make run` on 127.0.0.1): TLS cannot apply there, and HTTPS-only settings would lock everyone out (a
# redirect to an https:// nobody serves, cookies the browser never sends back over http). A site under any
# other name gets the HTTPS settings: put TLS in front (or set this, and `check --deploy` says what is off).
ARTWEB_PLAIN_HTTP = env.bool("ARTWEB_PLAIN_HTTP", default=LOCAL_ONLY)
if not DEBUG:
    # No SECURE_PROXY_SSL_HEADER: the scheme comes from the ASGI server, which takes X-Forwarded-Proto
    # from ARTWEB_TRUSTED_PROXIES only; Django reading the header would believe any client.
    SECURE_SSL_REDIRECT = not ARTWEB_PLAIN_HTTP and env.bool("SECURE_SSL_REDIRECT", default=True)
    # Health probes (the launcher's, a container's) ask over plain HTTP from inside.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SESSION_COOKIE_SECURE = not ARTWEB_PLAIN_HTTP
    CSRF_COOKIE_SECURE = not ARTWEB_PLAIN_HTTP
    SECURE_HSTS_SECONDS = 0 if ARTWEB_PLAIN_HTTP else env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True
    if ARTWEB_PLAIN_HTTP and LOCAL_ONLY:
        # `check --deploy` warns about each HTTPS setting left off; over plain HTTP to this machine only
        # none of them can apply (HSTS and Secure cookies need TLS). Served under any other name, the
        # warnings stay: that site needs TLS in front.
        SILENCED_SYSTEM_CHECKS = ["security.W004", "security.W008", "security.W012", "security.W016"]

# Error reports (the technical 500 page with DEBUG on, logged reports) mask the password of every URL:
# Django's own filter hides settings by name, and REDIS_URL or CELERY_BROKER_URL match none of its names.
DEFAULT_EXCEPTION_REPORTER = "artweb.error_reports.UrlMaskingExceptionReporter"
DEFAULT_EXCEPTION_REPORTER_FILTER = "artweb.error_reports.UrlMaskingReporterFilter"

ARTWEB_METRICS_TOKEN = env.str("ARTWEB_METRICS_TOKEN", default="")
LOG_FORMAT = env.str("LOG_FORMAT", default="console" if DEBUG else "json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"context": {"()": "artweb.logging.ContextFilter"}},
    "formatters": {
        "json": {"()": "artweb.logging.JsonFormatter"},
        "console": {"()": "artweb.logging.ConsoleFormatter"},
    },
    # A StreamHandler that masks URL passwords (artweb.error_reports): tracebacks are logged in full.
    "handlers": {
        "console": {
            "class": "artweb.error_reports.UrlMaskingStreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["context"],
        }
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    # axes: failures and lockouts are warnings; its INFO lines repeat every successful sign-in.
    "loggers": {
        "wandb": {"level": "WARNING"},
        "weave": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "axes": {"level": "WARNING"},
    },
}
# Worker output goes through LOGGING (JSON in production, run/step ids) instead of Celery's own format.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# Per-user quotas (training.services.quotas): the deployment's defaults, for users whose own Quota row and
# groups' rows (set by staff in the admin) leave a limit empty. 0 is no limit.
ARTWEB_QUOTA_TRAJECTORY_MB = env.int("ARTWEB_QUOTA_TRAJECTORY_MB", default=10240)  # stored trajectories, MB
ARTWEB_QUOTA_CONCURRENT_RUNS = env.int("ARTWEB_QUOTA_CONCURRENT_RUNS", default=8)  # runs queued or running
ARTWEB_QUOTA_STEPS_PER_DAY = env.int("ARTWEB_QUOTA_STEPS_PER_DAY", default=5000)  # training steps in 24 hours
ARTWEB_QUOTA_ATTACHMENT_MB = env.int("ARTWEB_QUOTA_ATTACHMENT_MB", default=10240)  # data attachments, MB
ARTWEB_QUOTA_GPU_HOURS_PER_DAY = env.float("ARTWEB_QUOTA_GPU_HOURS_PER_DAY", default=0)  # step hours in 24 hours
# The fair queue of training steps (training.selectors_queue): a GPU worker's next turn goes to the waiting run
# whose owner used the least GPU time (for their share weight) in this many hours.
ARTWEB_FAIR_SHARE_HOURS = env.float("ARTWEB_FAIR_SHARE_HOURS", default=1.0)
if not 0 < ARTWEB_FAIR_SHARE_HOURS <= 24 * 30:
    raise ImproperlyConfigured(
        f"ARTWEB_FAIR_SHARE_HOURS={ARTWEB_FAIR_SHARE_HOURS:g}: give the hours of GPU time the fair queue "
        "remembers, above 0 and at most 720 (30 days), e.g. 1."
    )
if not 0 <= ARTWEB_QUOTA_GPU_HOURS_PER_DAY <= 24_000:
    raise ImproperlyConfigured(
        f"ARTWEB_QUOTA_GPU_HOURS_PER_DAY={ARTWEB_QUOTA_GPU_HOURS_PER_DAY:g}: give the hours of training steps a "
        "user's runs may take in 24 hours, fractions allowed, from 0 (no limit) to 24000."
    )

# The egress guard (rollouts.sandbox.egress) for every connection made on a user's behalf: export targets
# and their test events, judge endpoints, the jail's HTTPS tunnels. Loopback, private, link-local and other
# non-public addresses are refused unless listed in ARTWEB_EGRESS_ALLOW as host:port (e.g.
# wandb.internal:8080,[::1]:8443); ports other than 443 and 80 unless listed in ARTWEB_EGRESS_PORTS.
from rollouts.sandbox.egress import EgressPolicy  # noqa: E402  (pure: imports no Django)

try:
    ARTWEB_EGRESS = EgressPolicy.parse(
        env.list("ARTWEB_EGRESS_ALLOW", default=[]), env.list("ARTWEB_EGRESS_PORTS", default=[])
    )
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from exc

# Who may give runs named hosts (training.services.tools): a run's agent reaching HTTPS hosts of its own
# choice through the jail's tunnel. off: nobody; staff; permitted: staff and the users and groups granted
# "Can let runs reach named hosts" (training.use_named_hosts) in the admin; all: every user.
ARTWEB_NAMED_HOSTS = env.str("ARTWEB_NAMED_HOSTS", default="off").strip().lower()
if ARTWEB_NAMED_HOSTS not in ("off", "staff", "permitted", "all"):
    raise ImproperlyConfigured(f"ARTWEB_NAMED_HOSTS={ARTWEB_NAMED_HOSTS!r}: use off, staff, permitted or all.")
