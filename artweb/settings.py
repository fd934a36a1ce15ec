"""Settings, read from the environment through one reader (django-environ).

Every value a deployment may change comes from an environment variable; the defaults are for
development. With DEBUG off, SECRET_KEY must be set: start-up stops with a message naming it.
"""

import warnings
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
DATA_DIR = Path(env.str("ARTWEB_DATA_DIR", default=str(BASE_DIR / "data"))).resolve()

_DEV_SECRET = "artweb-insecure-development-key-never-use-in-production"
SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Production mode (DEBUG=false) needs a long random SECRET_KEY "
            "in the environment, e.g. SECRET_KEY=$(python -c 'import secrets; print(secrets.token_urlsafe(50))')"
        )
    SECRET_KEY = _DEV_SECRET

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
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
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI files served locally: the docs page works offline
    "rollouts",
    "training",
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
# Bodies over this are refused by artweb.asgi before Django reads them (413). Above the largest upload
# (a 20 MiB scenario file, 30 MiB as a JSON body); DATA_UPLOAD_MAX_MEMORY_SIZE still limits form fields.
ARTWEB_MAX_REQUEST_MB = env.int("ARTWEB_MAX_REQUEST_MB", default=32)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Production serves the collectstatic output, compressed and with hashed names (cache forever);
    # development serves the source files as they are, so no collectstatic step is needed.
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG
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
# REMOTE_ADDR only: uvicorn --proxy-headers already sets it from a trusted proxy's X-Forwarded-For, and
# reading that header here would let a client pick a fresh address for every guess.
AXES_IPWARE_META_PRECEDENCE_ORDER = ("REMOTE_ADDR",)

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
    "DEFAULT_THROTTLE_RATES": {
        "writes": env.str("ARTWEB_THROTTLE_WRITES", default="120/min"),
        "uploads": env.str("ARTWEB_THROTTLE_UPLOADS", default="30/min"),
        "runs": env.str("ARTWEB_THROTTLE_RUNS", default="30/min"),
        "tokens": env.str("ARTWEB_THROTTLE_TOKENS", default="10/min"),
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
    # "auto": merged weights on the CPU build, runtime LoRA on GPU (see rollouts.runtime.vllm_server).
    "VLLM_ADAPTER_MODE": env.str("ARTWEB_VLLM_ADAPTER_MODE", default="auto"),
    # The inference server of a CPU worker: "auto" (measured per processor, rollouts.runtime.cpu_probe),
    # "vllm" or "ctranslate2". A GPU worker runs vLLM unless told otherwise.
    "INFERENCE_ENGINE": env.str("ARTWEB_INFERENCE_ENGINE", default="auto"),
    "TRAINER_BACKEND": env.str("ARTWEB_TRAINER_BACKEND", default="peft"),
    "DEVICE": env.str("ARTWEB_DEVICE", default="cpu"),
    "HEARTBEAT_SECONDS": env.int("ARTWEB_HEARTBEAT_SECONDS", default=15),
    # How often a worker sweeps for stale runs and owed messages (training.sweeper); 0 turns it off.
    "SWEEP_SECONDS": env.float("ARTWEB_SWEEP_SECONDS", default=10.0),
    # How user code is isolated (rollouts.runtime.jail): "jail" (bubblewrap + cgroups; the worker must run
    # as root) or "insecure-no-jail", a development opt-out that leaves the worker ownable by any script
    # and marks every run that uses it with a warning event.
    "SANDBOX": env.str("ARTWEB_SANDBOX", default="jail"),
    # The uid user code runs as outside its namespace: unused by anyone else, neither root nor the worker's.
    "SANDBOX_UID": env.int("ARTWEB_SANDBOX_UID", default=64000),
    # A delegated cgroup v2 directory for the batches' limits; empty: the host's hierarchy (root only).
    "SANDBOX_CGROUP": env.str("ARTWEB_SANDBOX_CGROUP", default=""),
    # Hosts of private addresses (loopback, private networks) that users' RULER judge endpoints may name;
    # every other judge endpoint must be public, so no user can aim the worker at its own network.
    "JUDGE_PRIVATE_HOSTS": env.list("ARTWEB_JUDGE_PRIVATE_HOSTS", default=[]),
    # The OpenAI-compatible endpoint (training.services.serving): how long a request may wait for a worker
    # and its answer, and how many adapters each worker keeps ready (LRU).
    "SERVE_TIMEOUT_SECONDS": env.float("ARTWEB_SERVE_TIMEOUT_SECONDS", default=600.0),
    "SERVE_ADAPTERS": env.int("ARTWEB_SERVE_ADAPTERS", default=4),
}

if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True

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
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["context"]}},
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
