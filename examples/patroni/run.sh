#!/usr/bin/env bash
# A primary failover under load on a Patroni cluster:
#
#   examples/patroni/run.sh synchronous|asynchronous [--keys N] [--clients N]
#
# Starts, in a temporary directory and all on 127.0.0.1: three etcd members,
# two Patroni nodes managing Postgres 15 (a primary and a streaming standby;
# Patroni's synchronous_mode on for `synchronous`, off for `asynchronous`),
# and HAProxy routing to whichever node's Patroni REST API answers
# GET /primary. Once there is a leader and its standby streams, it runs
# `chaos --failover` (examples/chaos.rs) against HAProxy's address; the
# chaos run kills the leader's node (its Patroni and its postmaster, SIGKILL)
# once three eighths of the keys are answered, waits for Patroni to promote
# the standby and HAProxy to follow it, finishes the load and prints the
# figures. Everything is stopped and removed when the script ends; the
# whole run is bounded by RUN_TIMEOUT seconds (default 900).
#
# KILL=postmaster kills only the leader's postmaster and its children,
# leaving its Patroni running (which restarts Postgres in place: no failover).
#
# Environment: PG_BIN (default /usr/lib/postgresql/15/bin); CHAOS, a built
# chaos example to run instead of `cargo run --example chaos`; KEEP=1 keeps
# the temporary directory (logs) after the run.
set -euo pipefail

usage() {
    echo "usage: $0 synchronous|asynchronous [--keys N] [--clients N]" >&2
    exit 2
}
[ $# -ge 1 ] || usage
replication=$1
shift
case $replication in
synchronous) synchronous_mode=true ;;
asynchronous) synchronous_mode=false ;;
*) usage ;;
esac

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
pg_bin=${PG_BIN:-/usr/lib/postgresql/15/bin}
run_timeout=${RUN_TIMEOUT:-900}
for tool in etcd patroni haproxy curl python3 "$pg_bin/postgres"; do
    command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 2; }
done

dir=$(mktemp -d /tmp/idem-patroni-XXXXXX)
chmod 755 "$dir"
pids=()
teardown() {
    set +e
    for pid in "${pids[@]}"; do
        kill -9 "$pid" 2>/dev/null
    done
    for _ in $(seq 50); do
        alive=0
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ $alive = 1 ] || break
        sleep 0.1
    done
    for node in 1 2; do
        pidfile=$dir/node$node/data/postmaster.pid
        if [ -f "$pidfile" ]; then
            pm=$(head -1 "$pidfile")
            kill -9 "$pm" 2>/dev/null
            pkill -9 -P "$pm" 2>/dev/null
        fi
    done
    sleep 0.2
    if [ "${KEEP:-}" = 1 ]; then
        echo "logs kept in $dir" >&2
    else
        rm -rf "$dir"
    fi
}
trap teardown EXIT
trap 'exit 1' INT TERM

# Patroni and Postgres run as `postgres` when this script runs as root.
as_postgres=()
if [ "$(id -u)" = 0 ]; then
    as_postgres=(setpriv --reuid=postgres --regid=postgres --init-groups --)
fi

# Eleven free loopback ports below the ephemeral range (which other
# processes' outgoing connections draw from while this script starts).
read -r -a ports < <(python3 -c '
import random, socket
ports = []
for port in random.sample(range(20000, 32000), 200):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    ports.append(port)
    if len(ports) == 11:
        break
print(" ".join(map(str, ports)))
')
etcd_client=("${ports[0]}" "${ports[1]}" "${ports[2]}")
etcd_peer=("${ports[3]}" "${ports[4]}" "${ports[5]}")
pg_port=("" "${ports[6]}" "${ports[7]}")
rest_port=("" "${ports[8]}" "${ports[9]}")
haproxy_port=${ports[10]}

# etcd: three members.
initial_cluster=""
for i in 0 1 2; do
    initial_cluster+="${initial_cluster:+,}etcd$i=http://127.0.0.1:${etcd_peer[$i]}"
done
etcd_hosts=""
for i in 0 1 2; do
    etcd_hosts+="${etcd_hosts:+,}127.0.0.1:${etcd_client[$i]}"
    etcd --name "etcd$i" --data-dir "$dir/etcd$i" \
        --listen-client-urls "http://127.0.0.1:${etcd_client[$i]}" \
        --advertise-client-urls "http://127.0.0.1:${etcd_client[$i]}" \
        --listen-peer-urls "http://127.0.0.1:${etcd_peer[$i]}" \
        --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer[$i]}" \
        --initial-cluster "$initial_cluster" --initial-cluster-state new \
        --initial-cluster-token "idem-$$" >"$dir/etcd$i.log" 2>&1 &
    pids+=($!)
    disown
done

wait_for() { # seconds, description, command...
    local bound=$1 what=$2 started=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        if [ $((SECONDS - started)) -ge "$bound" ]; then
            echo "timed out after ${bound}s waiting for $what (logs: $dir)" >&2
            KEEP=1
            exit 1
        fi
        sleep 0.2
    done
}
for i in 0 1 2; do
    wait_for 60 "etcd$i" curl -fsS "http://127.0.0.1:${etcd_client[$i]}/health"
done

# Patroni: two nodes.
patroni_pid=("")
for node in 1 2; do
    node_dir=$dir/node$node
    mkdir -p "$node_dir"
    sed -e "s|@NODE@|node$node|" \
        -e "s|@REST_PORT@|${rest_port[$node]}|" \
        -e "s|@PG_PORT@|${pg_port[$node]}|" \
        -e "s|@ETCD_HOSTS@|$etcd_hosts|" \
        -e "s|@SYNCHRONOUS_MODE@|$synchronous_mode|" \
        -e "s|@DIR@|$node_dir|g" \
        -e "s|@PG_BIN@|$pg_bin|" \
        "$here/patroni.yml.in" >"$node_dir/patroni.yml"
    chmod 700 "$node_dir"
    [ ${#as_postgres[@]} -eq 0 ] || chown -R postgres:postgres "$node_dir"
    (cd "$node_dir" && exec env HOME="$node_dir" "${as_postgres[@]}" patroni "$node_dir/patroni.yml") \
        >"$node_dir/patroni.log" 2>&1 &
    pids+=($!)
    patroni_pid+=($!)
    disown
    # The first node bootstraps the cluster; the second clones it.
    [ $node = 2 ] || wait_for 120 "node1 to lead" curl -fsS "http://127.0.0.1:${rest_port[1]}/primary"
done
wait_for 120 "node2 to stream" curl -fsS "http://127.0.0.1:${rest_port[2]}/replica"
if [ "$synchronous_mode" = true ]; then
    wait_for 60 "node2 to be synchronous" curl -fsS "http://127.0.0.1:${rest_port[2]}/sync"
fi

# HAProxy: the address that follows the leader.
sed -e "s|@HAPROXY_PORT@|$haproxy_port|" \
    -e "s|@PG_PORT_1@|${pg_port[1]}|" -e "s|@PG_PORT_2@|${pg_port[2]}|" \
    -e "s|@REST_PORT_1@|${rest_port[1]}|" -e "s|@REST_PORT_2@|${rest_port[2]}|" \
    "$here/haproxy.cfg.in" >"$dir/haproxy.cfg"
haproxy -db -f "$dir/haproxy.cfg" >"$dir/haproxy.log" 2>&1 &
pids+=($!)
disown
wait_for 30 "HAProxy" "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$haproxy_port" -U postgres

# The leader is node1, its standby node2. Killing the leader's node: its
# Patroni first (left alive, it would restart the postmaster in place and
# keep the leader key), then its postmaster and the postmaster's children.
case ${KILL:-node} in
node) kill_patroni="kill -9 ${patroni_pid[1]}" ;;
postmaster) kill_patroni=":" ;;
*) echo "KILL=$KILL: node or postmaster" >&2; exit 2 ;;
esac
cat >"$dir/kill-leader.sh" <<SCRIPT
$kill_patroni
pm=\$(head -1 "$dir/node1/data/postmaster.pid")
kill -9 "\$pm"
pkill -9 -P "\$pm" || true
SCRIPT

echo "patroni $(patroni --version | awk '{print $2}'), etcd $(etcd --version | awk 'NR==1{print $3}'), $(haproxy -v | awk 'NR==1{print "HAProxy", $3}'), $("$pg_bin/postgres" --version | awk '{print "Postgres", $3}'); synchronous_mode: $synchronous_mode; killing the leader's ${KILL:-node}"
if [ -n "${CHAOS:-}" ]; then
    chaos=("$CHAOS")
else
    chaos=(cargo run --quiet --manifest-path "$repo/Cargo.toml" --example chaos --)
fi
set +e
timeout --signal=KILL "$run_timeout" "${chaos[@]}" --failover \
    --cluster-url "postgres://postgres@127.0.0.1:$haproxy_port" \
    --standby-url "postgres://postgres@127.0.0.1:${pg_port[2]}" \
    --kill-cmd "sh $dir/kill-leader.sh" \
    --replication "$replication" "$@"
status=$?
set -e
if [ $status -eq 0 ]; then
    for node in 1 2; do
        if state=$(curl -fsS "http://127.0.0.1:${rest_port[$node]}/patroni" 2>/dev/null); then
            python3 -c '
import json, sys
state = json.loads(sys.argv[2])
print("after the run: node%s is %s on timeline %s" % (sys.argv[1], state["role"], state.get("timeline")))
' $node "$state"
        else
            echo "after the run: node$node is down"
        fi
    done
else
    KEEP=1
fi
exit $status
