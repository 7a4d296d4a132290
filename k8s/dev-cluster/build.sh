#!/bin/bash
# Build the Kubernetes v1.20.2 server binaries (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet) from
# Debian bookworm's `kubernetes` source package (the full upstream tree with vendor/) with Debian's Go, offline
# (GOPATH mode as upstream's hack/ does, GOPROXY=off). Called by up.sh; results are cached in $AGENTRL_K8S_DIR/bin,
# so only the first run on a machine pays the ~10 minute build. Usage: build.sh [component ...]
#
# What building 1.20 with Go 1.19 on a shared host needs (each fix is marked "agentrl-dev-cluster" in the tree):
#  1. `make gen_openapi` first: the one generated file upstream does not commit (needs rsync).
#  2. vendored github.com/modern-go/reflect2 v1.0.1 crashes kube-apiserver under Go >= 1.18 ("fatal error: fault" in
#     mapiterinit): replaced by Debian's golang-github-modern-go-reflect2-dev 1.0.2 (the upstream fix).
#  3. kubelet: a negative oom_score_adj fails where the host lacks CAP_SYS_RESOURCE (runc "can't get final child's
#     PID"), so pause/Guaranteed containers use 0; kernel sysctls are only warned about, never rewritten on the host;
#     pod and container logs live under the cluster directory instead of /var/log; and (a dev convenience, not a fix)
#     AGENTRL_DEV_NODE_CPUS overrides the CPU capacity the node reports, so a 2-core machine schedules many sandboxes.
#  4. kubemark (only when asked for: build.sh kubemark; the hollow nodes of benchmarks/bench_k8s_scale.py): a hollow
#     node's pod IP (AGENTRL_HOLLOW_POD_IP, upstream a fixed 192.168.192.168), its pod capacity
#     (AGENTRL_HOLLOW_MAX_PODS, upstream 110), its memory (AGENTRL_HOLLOW_MEMORY_MB, upstream 3.75 GiB) and its
#     ephemeral storage (AGENTRL_HOLLOW_DISK_MB, upstream 0: no pod with a storage limit fits; the fake cAdvisor's root
#     file system and the stub container manager's capacity) come from
#     the environment, and the containers named in AGENTRL_HOLLOW_EXIT_AT_ONCE (agentrl's init container) exit 0 as
#     they start (upstream's fake runtime never ends a container, so a pod with an init container never runs); unset,
#     each stays upstream's; and the fake OS's file map gets a lock (upstream's kubemark dies of "concurrent map
#     writes" at ~50 pods per node). Only cmd/kubemark and the fakes it uses (fake cAdvisor, fake CRI runtime, stub
#     container manager, fake OS) change.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
P=${AGENTRL_K8S_DIR:-$HOME/.cache/agentrl/k8s}
PKG_VERSION=${K8S_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}
UPSTREAM=kubernetes-1.20.2
S=$P/src/$UPSTREAM
log() { echo "build: $*" >&2; }

fetch_source() {  # Debian source package via a private apt config under $P (nothing in /etc is written)
  [ -d "$S/vendor" ] && return 0
  mkdir -p "$P/apt/lists/partial" "$P/apt/cache/archives/partial" "$P/src"
  # deb-src lines for the machine's own Debian mirrors, read from its apt sources
  { grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' || true
    grep -h '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2}' || true
  } | sort -u | while read -r u; do
    case $u in *-security) echo "deb-src $u bookworm-security main" ;; *) echo "deb-src $u bookworm main" ;; esac
  done > "$P/apt/src.list"
  local o=(-o "Dir::Etc::SourceList=$P/apt/src.list" -o Dir::Etc::SourceParts=/dev/null
           -o "Dir::State::Lists=$P/apt/lists" -o "Dir::Cache=$P/apt/cache")
  apt-get "${o[@]}" update -qq
  (cd "$P/src" && apt-get "${o[@]}" source --download-only "kubernetes=$PKG_VERSION")
  rm -rf "$S.tmp" "$P/src/deb" && mkdir -p "$S.tmp" "$P/src/deb"
  tar -C "$S.tmp" --strip-components=1 -xzf "$P"/src/kubernetes_*.orig.tar.gz
  tar -C "$P/src/deb" -xJf "$P"/src/kubernetes_*.debian.tar.xz
  while read -r p; do [ -n "$p" ] && patch -s -d "$S.tmp" -p1 < "$P/src/deb/debian/patches/$p"; done < "$P/src/deb/debian/patches/series"
  mv "$S.tmp" "$S"
}

patch_kubelet() {  # fix 3 (see the header)
  grep -q agentrl-dev-cluster "$S/pkg/kubelet/cm/container_manager_linux.go" && return 0
  patch -s -d "$S" -p1 < "$HERE/kubelet-no-host-sysctls.patch"
  local m='// agentrl-dev-cluster: upstream'
  sed -i "s#ContainerLogsDir = \"/var/log/containers\"#ContainerLogsDir = \"$P/var-log/containers\" $m /var/log/containers#" "$S/pkg/kubelet/kubelet.go"
  sed -i "s#legacyContainerLogsDir = \"/var/log/containers\"#legacyContainerLogsDir = \"$P/var-log/containers\" $m /var/log/containers#" "$S/pkg/kubelet/kuberuntime/legacy.go"
  sed -i "s#podLogsRootDirectory = \"/var/log/pods\"#podLogsRootDirectory = \"$P/var-log/pods\" $m /var/log/pods#" "$S/pkg/kubelet/kuberuntime/kuberuntime_manager.go"
  sed -i "s#defaultSandboxOOMAdj int = -998#defaultSandboxOOMAdj int = 0 $m -998#" "$S/pkg/kubelet/dockershim/docker_sandbox.go"
  sed -i "s#guaranteedOOMScoreAdj int = -997#guaranteedOOMScoreAdj int = 0 $m -997#" "$S/pkg/kubelet/qos/policy.go"
  grep -q agentrl-dev-cluster "$S/pkg/kubelet/dockershim/docker_sandbox.go" || { log "kubelet patch did not apply"; exit 1; }
  rm -f "$P/bin/kubelet"
}

patch_node_cpus() {  # a dev machine of 2 cores must schedule many sandboxes of 1 CPU each (requests == limits)
  local u=$S/pkg/kubelet/cadvisor/util.go
  grep -q agentrl-dev-cluster "$u" && return 0
  sed -i 's#int64(info.NumCores\*1000),#devNodeMilliCPU(info.NumCores), // agentrl-dev-cluster: upstream int64(info.NumCores*1000)#' "$u"
  sed -i 's#^\tgoruntime "runtime"#\t"os"\n\t"strconv"\n\tgoruntime "runtime"#' "$u"
  cat >> "$u" <<'GO'

// devNodeMilliCPU is the node's CPU capacity in millicores; AGENTRL_DEV_NODE_CPUS overrides the core count
// (agentrl-dev-cluster: a small machine may schedule more CPU requests than it has cores; each container keeps its
// own CFS limit).
func devNodeMilliCPU(cores int) int64 {
	if v, err := strconv.Atoi(os.Getenv("AGENTRL_DEV_NODE_CPUS")); err == nil && v > 0 {
		return int64(v * 1000)
	}
	return int64(cores * 1000)
}
GO
  grep -q devNodeMilliCPU\(info "$u" || { log "node CPU patch did not apply"; exit 1; }
  rm -f "$P/bin/kubelet"
}

patch_kubemark() {  # fix 4 (see the header)
  local h=$S/cmd/kubemark/hollow-node.go f=$S/pkg/kubelet/cadvisor/testing/cadvisor_fake.go
  if ! grep -q fakeDisk "$f"; then
    sed -i 's#^func (c \*Fake) RootFsInfo() (cadvisorapiv2.FsInfo, error) {#&\n\treturn cadvisorapiv2.FsInfo{Capacity: fakeDisk(), Available: fakeDisk()}, nil // agentrl-dev-cluster#' "$f"
    cat >> "$f" <<'GO'

// fakeDisk is the hollow node's root file system size: AGENTRL_HOLLOW_DISK_MB, else 0 as upstream (agentrl-dev-cluster).
func fakeDisk() uint64 {
	v, _ := strconv.ParseUint(os.Getenv("AGENTRL_HOLLOW_DISK_MB"), 10, 64)
	return v << 20
}
GO
    rm -f "$P/bin/kubemark"
  fi
  local o=$S/pkg/kubelet/container/testing/os.go  # kubemark's FakeOS: a map written by every pod worker
  if ! grep -q agentrl-dev-cluster "$o"; then
    sed -i 's#^\t"time"\n)#&#; s#^import (#import (\n\t"sync"#' "$o"
    sed -i 's#^func (f \*FakeOS) Create(path string) (\*os.File, error) {#&\n\tfakeOSMu.Lock() // agentrl-dev-cluster: upstream unlocked, "fatal error: concurrent map writes" at ~50 pods per node\n\tdefer fakeOSMu.Unlock()#' "$o"
    sed -i 's#^func (f \*FakeOS) Remove(path string) error {#&\n\tfakeOSMu.Lock() // agentrl-dev-cluster\n\tdefer fakeOSMu.Unlock()#; s#^func (f \*FakeOS) RemoveAll(path string) error {#&\n\tfakeOSMu.Lock() // agentrl-dev-cluster\n\tdefer fakeOSMu.Unlock()#' "$o"
    printf '\n// fakeOSMu serializes FakeOS writes (agentrl-dev-cluster: kubemark runs pod workers concurrently).\nvar fakeOSMu sync.Mutex\n' >> "$o"
    grep -q 'fakeOSMu.Lock() // agentrl-dev-cluster: upstream' "$o" || { log "FakeOS patch did not apply"; exit 1; }
    rm -f "$P/bin/kubemark"
  fi
  local m=$S/pkg/kubelet/cm/container_manager_stub.go  # the capacity the node reports comes from here
  if ! grep -q agentrl-dev-cluster "$m"; then
    perl -0pi -e 's#(v1.ResourceEphemeralStorage: \*resource.NewQuantity\(\n\t\t\t)int64\(0\),#$1int64(hollowDiskBytes()), // agentrl-dev-cluster: upstream 0#' "$m"
    sed -i 's#^import (#import (\n\t"os"\n\t"strconv"\n#' "$m"
    cat >> "$m" <<'GO'

// hollowDiskBytes: AGENTRL_HOLLOW_DISK_MB, else 0 as upstream (agentrl-dev-cluster: kubemark's hollow nodes).
func hollowDiskBytes() uint64 {
	v, _ := strconv.ParseUint(os.Getenv("AGENTRL_HOLLOW_DISK_MB"), 10, 64)
	return v << 20
}
GO
    grep -q 'int64(hollowDiskBytes())' "$m" || { log "stub container manager patch did not apply"; exit 1; }
    rm -f "$P/bin/kubemark"
  fi
  grep -q agentrl-dev-cluster "$h" && return 0
  sed -i 's#^\tmaxPods     = 110#\tupstreamMaxPods = 110 // agentrl-dev-cluster: upstream maxPods#' "$h"
  sed -i 's#^\t\tMaxPods:             maxPods,#\t\tMaxPods:             envInt("AGENTRL_HOLLOW_MAX_PODS", upstreamMaxPods),#' "$h"
  sed -i 's#^\tif config.Morph == "kubelet" {#\tif ip := os.Getenv("AGENTRL_HOLLOW_POD_IP"); ip != "" { // agentrl-dev-cluster\n\t\tcriapitest.FakePodSandboxIPs = []string{ip}\n\t}\n\tif config.Morph == "kubelet" {#' "$h"
  sed -i 's#^\tcadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"#\t"strconv"\n\n\tcriapitest "k8s.io/cri-api/pkg/apis/testing"\n\tcadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"#' "$h"
  cat >> "$h" <<'GO'

// envInt reads a positive integer from the environment (agentrl-dev-cluster: hollow nodes sized for a scale run).
func envInt(name string, fallback int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return fallback
}
GO
  sed -i 's#^\t\tMemoryCapacity: fakeMemoryCapacity,#\t\tMemoryCapacity: fakeMemory(), // agentrl-dev-cluster: upstream fakeMemoryCapacity#' "$f"
  sed -i 's#^import (#import (\n\t"os"\n\t"strconv"\n#' "$f"
  cat >> "$f" <<'GO'

// fakeMemory is the hollow node's memory: AGENTRL_HOLLOW_MEMORY_MB, else upstream's (agentrl-dev-cluster).
func fakeMemory() uint64 {
	if v, err := strconv.ParseUint(os.Getenv("AGENTRL_HOLLOW_MEMORY_MB"), 10, 64); err == nil && v > 0 {
		return v << 20
	}
	return fakeMemoryCapacity
}
GO
  local r=$S/vendor/k8s.io/cri-api/pkg/apis/testing/fake_runtime_service.go
  sed -i 's#^\tc.StartedAt = time.Now().UnixNano()#\tc.StartedAt = time.Now().UnixNano()\n\tif exitsAtOnce(c.Metadata.GetName()) { // agentrl-dev-cluster\n\t\tc.State = runtimeapi.ContainerState_CONTAINER_EXITED\n\t\tc.FinishedAt = c.StartedAt\n\t}#' "$r"
  sed -i 's#^import (#import (\n\t"os"\n\t"strings"\n#' "$r"
  cat >> "$r" <<'GO'

// exitsAtOnce: a container named in AGENTRL_HOLLOW_EXIT_AT_ONCE (comma-separated) exits 0 as it starts
// (agentrl-dev-cluster: an init container of a hollow node's pod must end for the pod to run).
func exitsAtOnce(name string) bool {
	for _, n := range strings.Split(os.Getenv("AGENTRL_HOLLOW_EXIT_AT_ONCE"), ",") {
		if n != "" && n == name {
			return true
		}
	}
	return false
}
GO
  grep -q 'exitsAtOnce(c.Metadata' "$r" && grep -q 'envInt("AGENTRL_HOLLOW_MAX_PODS"' "$h" && grep -q 'criapitest.FakePodSandboxIPs' "$h" \
    && grep -q 'fakeMemory(), //' "$f" || { log "kubemark patch did not apply"; exit 1; }
  rm -f "$P/bin/kubemark"
}

replace_reflect2() {  # fix 2
  [ -f "$S/vendor/github.com/modern-go/reflect2/go_above_118.go" ] && return 0
  local d=/usr/share/gocode/src/github.com/modern-go/reflect2
  [ -d $d ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-github-modern-go-reflect2-dev >/dev/null
  rm -rf "$S/vendor/github.com/modern-go/reflect2"
  cp -r $d "$S/vendor/github.com/modern-go/reflect2"
  rm -f "$S/vendor/github.com/modern-go/reflect2/go.mod" "$P"/bin/kube-* "$P/bin/kubelet"
}

build() {
  mkdir -p "$P/gopath/src/k8s.io" "$P/bin" "$P/gocache"
  ln -sfn "$S" "$P/gopath/src/k8s.io/kubernetes"
  cd "$P/gopath/src/k8s.io/kubernetes"
  export GOPATH=$P/gopath GOCACHE=$P/gocache GO111MODULE=off GOPROXY=off CGO_ENABLED=0 GOFLAGS=
  if [ ! -f pkg/generated/openapi/zz_generated.openapi.go ]; then  # fix 1
    command -v rsync >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rsync >/dev/null
    local s; s=$(date +%s); make gen_openapi >/dev/null; log "generated openapi in $(( $(date +%s) - s ))s"
  fi
  local v=v1.20.2 d ld="-s -w" pkg kv c s
  d=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for pkg in client-go/pkg/version component-base/version; do
    for kv in gitVersion=$v gitMajor=1 gitMinor=20 gitTreeState=clean buildDate=$d "gitCommit=debian-$PKG_VERSION"; do
      ld="$ld -X k8s.io/kubernetes/vendor/k8s.io/$pkg.$kv"
    done
  done
  for c in "${@:-kube-apiserver kube-controller-manager kube-scheduler kubelet}"; do
    for c in $c; do
      [ -x "$P/bin/$c" ] && continue
      s=$(date +%s)
      nice go build -tags selinux,notest -ldflags "$ld" -o "$P/bin/$c.tmp" "./cmd/$c"
      mv "$P/bin/$c.tmp" "$P/bin/$c"
      log "built $c in $(( $(date +%s) - s ))s"
    done
  done
}

command -v go >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null; }
fetch_source
patch_kubelet
patch_node_cpus
replace_reflect2
case " $* " in *" kubemark "*) patch_kubemark ;; esac
build "$@"
