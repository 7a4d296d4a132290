#!/bin/bash
# A real single-node Kubernetes (v1.20.2) on this machine, from Debian packages only, for the `k8s` test tier, the
# benchmarks and trying the kubernetes backend: etcd (Debian etcd-server), kube-apiserver, kube-controller-manager,
# kube-scheduler and a kubelet built from Debian's `kubernetes` source package (build.sh, once per machine), and a
# private dockerd (Debian docker.io) as the kubelet's container runtime.
#
#   k8s/dev-cluster/up.sh                       start it (or find it running); the LAST LINE printed is the path of
#                                               an admin kubeconfig: export KUBECONFIG=$(k8s/dev-cluster/up.sh | tail -1)
#   k8s/dev-cluster/load-image.sh IMAGE         put a locally built image into the cluster's dockerd
#   k8s/dev-cluster/down.sh                     stop it; the host is left as it was
#
# Idempotent: a healthy running cluster is reused; a half-running one is stopped (down.sh) and started afresh.
# Every start is a fresh cluster (empty etcd); the binaries, PKI and the images loaded into the private dockerd stay.
#
# Host hygiene: everything lives under $AGENTRL_K8S_DIR (default ~/.cache/agentrl/k8s). The private dockerd has its
# own socket, data root, exec root and bridge and runs with --iptables=false --ip-masq=false --ip-forward=false, so
# the machine's own Docker Engine is untouched; nothing in /etc, host iptables or sysctls changes (the kubelet is
# patched to only warn about sysctls). The kubelet's pod cgroups live under one cgroup (/agentrl-k8s) that down.sh
# removes. The API server listens on the bridge address only (reachable from the host and from pods).
#
# What it does not do: API 1.20 only; no kube-proxy (ClusterIP Services do not route), no CNI (NetworkPolicy is
# accepted but NOT enforced), no cluster DNS; only locally loaded images (imagePullPolicy Never/IfNotPresent).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
P=${AGENTRL_K8S_DIR:-$HOME/.cache/agentrl/k8s}
BRIDGE=${AGENTRL_K8S_BRIDGE:-agentrl-k8s0}
BRIDGE_CIDR=${AGENTRL_K8S_BRIDGE_CIDR:-10.213.77.1/24}
API_IP=${BRIDGE_CIDR%/*}
API_PORT=${AGENTRL_K8S_API_PORT:-6443}
ETCD_PORT=${AGENTRL_K8S_ETCD_PORT:-12379}  # not 2379: a packaged etcd service may hold it
KUBELET_PORT=${AGENTRL_K8S_KUBELET_PORT:-10250}
POD_PIDS_LIMIT=${AGENTRL_K8S_POD_PIDS_LIMIT:-256}
NODE_CPUS=${AGENTRL_K8S_NODE_CPUS:-16}  # CPU capacity the node reports (sandboxes request 1 CPU each by default)
CGROUP_ROOT=/agentrl-k8s
NODE=127.0.0.1  # node name, as upstream's hack/local-up-cluster.sh: the kubelet serves on loopback only
SERVICE_CIDR=10.0.0.0/24
R=$P/run C=$P/pki D=$P/docker K=$P/kubelet
COMPONENTS="etcd kube-apiserver kube-controller-manager kube-scheduler dockerd kubelet"
export KUBECONFIG=$C/admin.kubeconfig
T0=$(date +%s)
say() { echo "up: [+$(( $(date +%s) - T0 ))s] $*" >&2; }
die() { echo "up: $*" >&2; exit 1; }
alive() { [ -f "$R/$1.pid" ] && kill -0 "$(cat "$R/$1.pid")" 2>/dev/null; }
node_ready() {
  kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

already_up() {  # 0: every component runs and the node is Ready; 1: nothing runs; 2: some run
  local n up=0 down=0
  for n in $COMPONENTS; do if alive "$n"; then up=$((up + 1)); else down=$((down + 1)); fi; done
  [ "$down" = 0 ] && node_ready && return 0
  [ "$up" = 0 ] && return 1
  return 2
}

install_packages() {  # only what is missing, from Debian
  local pk=() b
  for b in go:golang-go etcd:etcd-server dockerd:docker.io openssl:openssl gcc:gcc rsync:rsync ip:iproute2 \
           curl:curl; do
    command -v "${b%%:*}" >/dev/null || pk+=("${b#*:}")
  done
  [ -e "/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x)/libc.a" ] || pk+=(libc6-dev)
  if [ ${#pk[@]} -gt 0 ]; then
    say "apt-get install ${pk[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pk[@]}" >/dev/null
  fi
}

build_binaries() {
  local want="kube-apiserver kube-controller-manager kube-scheduler kubelet" c missing=""
  command -v kubectl >/dev/null || want="$want kubectl"
  for c in $want; do [ -x "$P/bin/$c" ] || missing="$missing $c"; done
  if [ -n "$missing" ]; then
    say "building$missing (once per machine; ~10 min cold)"
    bash "$HERE/build.sh" $missing
  fi
  export PATH=$PATH:$P/bin
}

make_pki() {  # CA, serving cert (bridge IP, loopback, the service IP), service-account key, static tokens: once
  [ -f "$C/tokens.csv" ] && [ "$(cat "$C/api-ip" 2>/dev/null)" = "$API_IP" ] && return 0
  rm -rf "$C" && mkdir -p "$C" && chmod 700 "$C"
  (
    cd "$C"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj /CN=agentrl-dev-cluster-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
    printf 'subjectAltName=IP:%s,IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' "$API_IP" > san.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 3650 -extfile san.ext 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    t() { openssl rand -hex 16; }
    { echo "$(t),admin,admin,system:masters"; echo "$(t),system:node:$NODE,kubelet,system:nodes"
      echo "$(t),system:kube-controller-manager,kcm"; echo "$(t),system:kube-scheduler,sched"; } > tokens.csv
    chmod 600 tokens.csv ./*.key
    echo "$API_IP" > api-ip
  )
}

kubeconfig() {  # NAME LINE-OF-tokens.csv
  local tok; tok=$(sed -n "$2p" "$C/tokens.csv" | cut -d, -f1)
  (umask 077; cat > "$C/$1.kubeconfig") <<KC
apiVersion: v1
kind: Config
clusters: [{name: agentrl-dev, cluster: {server: "https://$API_IP:$API_PORT", certificate-authority: "$C/ca.crt"}}]
users: [{name: $1, user: {token: "$tok"}}]
contexts: [{name: $1@agentrl-dev, context: {cluster: agentrl-dev, user: $1, namespace: default}}]
current-context: $1@agentrl-dev
KC
}

start() {  # NAME COMMAND...: in the background, logging to $P/logs/NAME.log, PID recorded for down.sh
  local name=$1; shift
  setsid "$@" > "$P/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$R/$name.pid"
  say "started $name (pid $!)"
}

wait_for() {  # WHAT SECONDS COMMAND...
  local what=$1 n=$2 i; shift 2
  for ((i = 0; i < n * 2; i++)); do
    "$@" >/dev/null 2>&1 && { say "$what ready"; return 0; }
    sleep 0.5
  done
  die "$what not ready after ${n}s; see $P/logs/ (down.sh stops what started)"
}

ensure_bridge() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || { ip link add "$BRIDGE" type bridge; ip addr add "$BRIDGE_CIDR" dev "$BRIDGE"; }
  ip link set "$BRIDGE" up
}

ensure_cgroup_root() {  # the kubelet's pod cgroups (pids limits need them) under one cgroup that down.sh removes
  local d
  for d in /sys/fs/cgroup/*/; do
    case $d in */unified/) continue ;; esac  # every v1 controller and the named systemd hierarchy
    [ -f "$d/cgroup.procs" ] && mkdir -p "$d${CGROUP_ROOT#/}"
  done
}

start_control_plane() {
  start etcd etcd --name agentrl-dev --data-dir "$P/etcd-data" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "agentrl-dev=http://127.0.0.1:$((ETCD_PORT + 1))" --listen-metrics-urls '' --log-level warn
  wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"
  start kube-apiserver "$P/bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address="$API_IP" --advertise-address="$API_IP" --secure-port="$API_PORT" --insecure-port=0 \
    --tls-cert-file="$C/apiserver.crt" --tls-private-key-file="$C/apiserver.key" --client-ca-file="$C/ca.crt" \
    --token-auth-file="$C/tokens.csv" --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$C/sa.pub" --service-account-signing-key-file="$C/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=true --cert-dir="$R/apiserver-certs" \
    --kubelet-preferred-address-types=Hostname,InternalIP --profiling=false
  wait_for kube-apiserver 120 curl -sf --cacert "$C/ca.crt" "https://$API_IP:$API_PORT/readyz"
  start kube-controller-manager "$P/bin/kube-controller-manager" --kubeconfig="$C/kcm.kubeconfig" \
    --leader-elect=false --port=0 --secure-port=0 --use-service-account-credentials=true \
    --service-account-private-key-file="$C/sa.key" --root-ca-file="$C/ca.crt" \
    --cluster-signing-cert-file="$C/ca.crt" --cluster-signing-key-file="$C/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --profiling=false
  start kube-scheduler "$P/bin/kube-scheduler" --kubeconfig="$C/sched.kubeconfig" --leader-elect=false --port=0 \
    --secure-port=0 --profiling=false
}

start_dockerd() {
  mkdir -p "$D"
  start dockerd dockerd --data-root "$D/data" --exec-root "$D/exec" --pidfile "$D/dockerd.pid" \
    -H "unix://$D/docker.sock" --bridge "$BRIDGE" --iptables=false --ip-masq=false --ip-forward=false \
    --storage-driver overlay2 --exec-opt native.cgroupdriver=cgroupfs --cgroup-parent "$CGROUP_ROOT/docker"
  wait_for dockerd 60 docker -H "unix://$D/docker.sock" version
  docker -H "unix://$D/docker.sock" image inspect k8s.gcr.io/pause:3.2 >/dev/null 2>&1 && return 0
  # the pod sandbox image, built from the source tree's pause.c (no registry)
  local i=$P/images/pause; rm -rf "$i"; mkdir -p "$i"
  gcc -Os -static -DVERSION=3.2 -o "$i/pause" "$P/src/kubernetes-1.20.2/build/pause/linux/pause.c"
  tar -C "$i" -c pause | docker -H "unix://$D/docker.sock" import -c 'ENTRYPOINT ["/pause"]' - k8s.gcr.io/pause:3.2 >/dev/null
  say "built image k8s.gcr.io/pause:3.2"
}

start_kubelet() {
  mkdir -p "$K"
  cat > "$K/config.yaml" <<KY
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $((KUBELET_PORT - 2))
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: $CGROUP_ROOT
enforceNodeAllocatable: []
podPidsLimit: $POD_PIDS_LIMIT
failSwapOn: false
makeIPTablesUtilChains: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
serializeImagePulls: false
# absolute eviction floors and no image GC: the defaults (evict below 10-15% free disk, GC images above 85% used)
# evicted sandbox pods on a large, mostly full developer disk, and image GC would delete images loaded without a registry
evictionHard: {memory.available: "100Mi", nodefs.available: "1Gi", imagefs.available: "1Gi", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
KY
  export AGENTRL_DEV_NODE_CPUS=$NODE_CPUS
  start kubelet "$P/bin/kubelet" --config="$K/config.yaml" --kubeconfig="$C/kubelet.kubeconfig" \
    --hostname-override="$NODE" --root-dir="$K/root" --cert-dir="$K/pki" --volume-plugin-dir="$K/volume-plugins" \
    --container-runtime=docker --docker-endpoint="unix://$D/docker.sock" \
    --container-runtime-endpoint="unix://$R/dockershim.sock" --image-service-endpoint="unix://$R/dockershim.sock" \
    --experimental-dockershim-root-directory="$K/dockershim" --pod-infra-container-image=k8s.gcr.io/pause:3.2 \
    --register-node=true --oom-score-adj=0
  wait_for "node $NODE" 120 node_ready
}

main() {
  mkdir -p "$R" "$P/logs" "$P/var-log"
  local state=0; already_up || state=$?
  if [ "$state" = 0 ]; then
    say "already running"
    echo "$KUBECONFIG"
    return 0
  fi
  if [ "$state" = 2 ]; then say "partly running: stopping it first"; bash "$HERE/down.sh" >&2; fi
  grep -q " $P/" /proc/mounts && bash "$HERE/down.sh" >&2
  install_packages
  build_binaries
  make_pki
  kubeconfig admin 1; kubeconfig kubelet 2; kubeconfig kcm 3; kubeconfig sched 4
  rm -rf "$P/etcd-data" "$K/root" "$K/dockershim" "$P/var-log" "$P/logs" && mkdir -p "$P/var-log" "$P/logs"
  ensure_bridge
  ensure_cgroup_root
  start_control_plane
  start_dockerd
  start_kubelet
  say "up: Kubernetes $(kubectl get --raw /version 2>/dev/null | grep -m1 gitVersion | tr -d ' ",' || true);" \
      "DOCKER_HOST=unix://$D/docker.sock; pods on $BRIDGE ($BRIDGE_CIDR)"
  echo "$KUBECONFIG"
}

main "$@"
