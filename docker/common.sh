# Sourced by the start scripts. Every role needs DATABASE_URL, REDIS_URL, SECRET_KEY (DEBUG=false) and
# the same ARTWEB_DATA_DIR contents (a shared volume): uploads, model weights, checkpoints.
set -euo pipefail
cd /app

# Workers start once the web role has migrated the database (it may still be starting).
wait_for_migrations() {
    for _ in $(seq 60); do
        python manage.py migrate --check >/dev/null 2>&1 && return 0
        sleep 5
    done
    echo "the database is still not migrated after 5 minutes; is the web role running?" >&2
    return 1
}
