# Sourced by the start scripts. Every role needs DATABASE_URL, REDIS_URL, SECRET_KEY (DEBUG=false) and
# the same ARTWEB_DATA_DIR contents (a shared volume): uploads, model weights, checkpoints.
set -euo pipefail
cd /app
# Uploads, checkpoints and logs are this user's alone: files 0600, folders 0700. The data dir itself too
# (not recursively: a 0700 top folder already closes everything below it, and the weights are large).
umask 077
if [ -d "${ARTWEB_DATA_DIR:-/data}" ] && [ -O "${ARTWEB_DATA_DIR:-/data}" ]; then
    chmod 700 "${ARTWEB_DATA_DIR:-/data}"
fi

# Workers start once the web role has migrated the database (it may still be starting).
wait_for_migrations() {
    for _ in $(seq 60); do
        python manage.py migrate --check >/dev/null 2>&1 && return 0
        sleep 5
    done
    echo "the database is still not migrated after 5 minutes; is the web role running?" >&2
    return 1
}
