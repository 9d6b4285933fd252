#!/usr/bin/env bash
# What a second row costs a one-row transaction, in PostgreSQL alone: the
# payments INSERT by itself against the same transaction with one more
# INSERT of four kinds (the outbox row; the outbox row without its due
# index; a two-column row with a primary key; the same row in a table with
# no index), pipelined as outbox.QueueAdd sends it, 8 clients, interleaved
# rounds. Prints each ratio's rounds and median. README, Performance,
# quotes it for the producer's bound.
#
#   bench/pgbench/second_row.sh [conninfo] [rounds] [seconds]
#
# It creates and drops a scratch database, second_row_bench, on the server
# conninfo names (default: postgres on 127.0.0.1:5432).
set -euo pipefail
conn=${1:-postgresql://postgres@127.0.0.1:5432/postgres}
rounds=${2:-5}
secs=${3:-5}
db=second_row_bench
for tool in psql pgbench python3; do
	command -v "$tool" >/dev/null || { echo "second_row: $tool is required" >&2; exit 1; }
done
dir=$(mktemp -d)
dbconn=$(python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$conn" "$db")
cleanup() { psql "$conn" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
psql "$conn" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
psql "$dbconn" -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE payments (
    id text PRIMARY KEY CHECK (id LIKE 'pay\_%'), client text NOT NULL, user_id text NOT NULL,
    amount_paise bigint NOT NULL CHECK (amount_paise > 0), currency text NOT NULL, method text NOT NULL,
    status text NOT NULL CHECK (status IN ('SUCCEEDED', 'REFUNDED')), version bigint NOT NULL DEFAULT 1,
    provider_ref text NOT NULL, provider_refund_ref text,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'REFUNDED') = (provider_refund_ref IS NOT NULL)));
CREATE INDEX payments_user_id ON payments (user_id, created_at);
-- pkg/outbox's table and indexes, as its migrations leave them.
CREATE TABLE outbox (
    id uuid PRIMARY KEY, aggregate_id text NOT NULL, aggregate_version bigint NOT NULL, event_type text NOT NULL,
    payload jsonb NOT NULL, headers jsonb NOT NULL DEFAULT '{}', occurred_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(), claimed_until timestamptz, last_error text);
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE published_at IS NULL;
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;
CREATE TABLE outbox_no_due (LIKE outbox INCLUDING DEFAULTS);
ALTER TABLE outbox_no_due ADD PRIMARY KEY (id);
CREATE TABLE two_columns (id uuid PRIMARY KEY, payload jsonb NOT NULL);
CREATE TABLE no_index (id uuid, payload jsonb NOT NULL);
SQL
pay="INSERT INTO payments (id, client, user_id, amount_paise, currency, method, status, version, provider_ref) VALUES ('pay_' || gen_random_uuid(), 'bench', 'u_17', 120000, 'INR', 'upi', 'SUCCEEDED', 1, 'pi_x') RETURNING id, created_at"
payload='{"payment_id":"pay_abcdefghijkl","user_id":"u_17","amount_paise":120000,"currency":"INR","status":"SUCCEEDED","client":"bench"}'
row() { echo "INSERT INTO $1 (id, aggregate_id, aggregate_version, event_type, payload, headers, occurred_at) VALUES (gen_random_uuid(), 'pay_abcdefghijkl', 1, 'PaymentSucceeded', '$payload', '{}', now())"; }
script() { # name, statements...
	local name=$1; shift
	{ printf '\\startpipeline\nBEGIN;\n'; printf '%s;\n' "$@"; printf 'COMMIT;\n\\endpipeline\n'; } >"$dir/$name.sql"
}
script payment "$pay"
script outbox "$pay" "$(row outbox)"
script outbox_no_due "$pay" "$(row outbox_no_due)"
script two_columns "$pay" "INSERT INTO two_columns VALUES (gen_random_uuid(), '$payload')"
script no_index "$pay" "INSERT INTO no_index VALUES (gen_random_uuid(), '$payload')"
for r in $(seq "$rounds"); do
	for s in payment outbox outbox_no_due two_columns no_index; do
		tps=$(pgbench "$dbconn" -n -M extended -c 8 -j 2 -T "$secs" -f "$dir/$s.sql" 2>&1 | awk '/^tps/ {print $3}')
		echo "$r $s $tps" | tee -a "$dir/results" >&2
	done
done
python3 - "$dir/results" <<'PY'
import collections, statistics, sys
tps = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, s, t = line.split()
    tps[r][s] = float(t)
print("payment alone: tx/s per round", [round(tps[r]["payment"]) for r in tps])
for s in ["outbox", "outbox_no_due", "two_columns", "no_index"]:
    ratios = sorted(tps[r][s] / tps[r]["payment"] for r in tps)
    print(f"payment + {s} row vs payment alone: median {statistics.median(ratios):.2f}x, rounds {[round(x, 2) for x in ratios]}")
PY
