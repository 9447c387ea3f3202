#!/bin/sh
# Entrypoint of every vlmq container under compose: the secrets step's files as settings, then the
# command itself (exec: it stays PID 1 where it was, so signals reach it unchanged).
set -eu
dir="${VLMQ_SECRETS_DIR:-/run/vlmq-secrets}"
VLMQ_REDIS_URL="redis://:$(cat "$dir/redis-password")@${VLMQ_REDIS_HOSTPORT:-redis:6379}/0"
export VLMQ_REDIS_URL
if [ -z "${VLMQ_API_KEYS:-}" ] && [ -z "${VLMQ_API_KEYS_FILE:-}" ]; then
  export VLMQ_API_KEYS_FILE="$dir/api-keys"
fi
FLOWER_BASIC_AUTH="$(cat "$dir/flower-user"):$(cat "$dir/flower-password")"
export FLOWER_BASIC_AUTH
exec "$@"
