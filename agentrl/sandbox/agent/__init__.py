"""The in-sandbox agent: a stdlib-only HTTP/1.1 server that runs INSIDE a sandbox.

It ships as one zip application (`agent.pyz`, built by `agentrl.sandbox.artifact`) into bubblewrap
sandboxes, Docker containers and Kubernetes pods, so it imports nothing outside the Python standard library and
nothing of agentrl. It owns: executing commands (process groups,
deadlines, output caps), reading/writing files confined to the workspace (and the backend's extra writable
directories, `--writable DIR[:DIR...]`, e.g. /repo), killing what commands leave behind, and
answering health checks. It does not own isolation or limits: the backend that started it applies those around it.

    agent.pyz --unix PATH --workspace DIR [--run-as UID:GID] [--writable D1:D2] [--cgroups v1|v2:D1[:D2...]]
                                                                               (local / docker: unix socket)
    agent.pyz --tcp HOST:PORT --token-file F --workspace DIR [--run-as U:G] [--relay NAME]
                                                                    (kubernetes: bearer token required)
    [--exit-grace S]: how long pipes held by a command's leftovers may delay its answer after it exits (0.1 s)
    [--handshake-timeout S]: how long a new connection may take to send its first request head (10 s)

uid separation (`--run-as UID:GID`, the agent itself runs as uid 0 with only CAP_SETUID, CAP_SETGID, CAP_KILL and,
where the backend's workspace is not pre-owned, CAP_CHOWN): every command runs as UID:GID with no supplementary
groups and no_new_privs, so it can neither signal, ptrace nor read the agent (its /proc entries, environ, fds), its
token or its socket directory; file requests are served with the thread's fsuid/fsgid set to UID:GID, so they get
exactly the command user's access (a symlink swapped in by a command cannot make the agent read a root-only file),
and what they create is owned by UID:GID. Without --run-as, commands run as the agent's own uid: nothing separates
them from it (`uid_separated: false` in /health). The agent is a child subreaper: orphans of commands are re-parented
to it (and reaped by it), so "every process a command left behind" is well defined in both modes.

The command spawner (separated by uid or by cgroup): commands are started by a persistent fork server per sandbox
(`Spawner`; its program: seccomp.py + spawner_program.py), started once by the agent, that already is UID:GID (no
groups, no capabilities, no_new_privs) and in `commands`, and is non-dumpable (a command cannot ptrace it or read its
memory); it posix_spawns (vfork) each command, so a command costs no setpriv (or cgroup shell) exec of its own. It
talks only to the agent (a socketpair; the command's pipes travel with SCM_RIGHTS), reports each command's pid, pidfd
and exit code, and is restarted for the next exec when /kill_all or the policy killed it. Where it cannot start,
commands start through setpriv as before.

The syscall policy (seccomp.py): the spawner installs one allow-list seccomp filter on itself before it serves,
so every command on every backend runs under it; its refusals go to the agent (seccomp user notification, the
listener passed with the spawner's ready answer), which answers them and counts them (`SeccompWatch`). The calls
that can signal another process go to the agent too and are let through; it counts those whose target is outside
the policy's own processes (`SignalTargets`). Attempts to reach a network the sandbox does not have are counted from
the network namespace's own counters (`NetAttempts`).

Resource separation (`--cgroups v1:D1:D2...` or `--cgroups v2:D`, each D a sandbox cgroup directory with `agent` and
`commands` children, the agent in `agent`): every command starts in `commands`, which carries the sandbox's memory,
pids and CPU limits, so a command filling them cannot take the agent's (`resources_separated` in /health). The
spawner is started in `commands` (cgroup v1: the spawning thread joins `commands`, its `tasks` files, for the fork
and returns to `agent`; v2, no per-thread membership: through `/bin/sh -c` which joins `commands` before it execs),
and so is every command it starts; without the spawner each command is started that way. Killing is then done
through the cgroup: `cgroup.kill` (v2) or SIGKILL of every process in `commands`' cgroup.procs, round after round, no
fork needed, until the reaper has released their pids; and /kill_all removes the sandbox's SysV IPC objects (shared
memory charged to the commands would otherwise outlive every process).

Commands in another container (`--relay NAME`, kubernetes, and docker without host cgroups): the agent runs in a
container of its own and every command runs in the commands' container (a pod's `sandbox`, docker's
`<name>-cmd`), under that container's limits
(`resources_separated`). The spawner is started there by the relay (relay_program.py, that container's main process, uid
0 with only CAP_SETUID / CAP_SETGID) on the agent's request over the abstract unix socket NAME; each side checks the
other's uid (SO_PEERCRED), so a command can neither ask the relay for a process nor pose as a relay. The pod shares
one pid namespace, so /kill_all reaches the commands; pids are counted per pod, so the agent keeps PARKED_WORKERS
threads from start-up and /kill_all signals the command user from its own thread (kill_all_as: raw per-thread
setresuid, kill(-1)): neither needs a new thread or process when the commands hold every pid. There is no fallback
to starting commands itself. The commands' orphans go to that pid namespace's init, not to the agent: a command that
kills or stops its own spawner (`kill -9 -1`) keeps its output, but its exit code is lost (126 and a note: the
policy's doing).

Modules (relative imports only, so the package runs the same from this directory and from inside the artifact):
`protocol` (the wire constants; the only module the host side imports), `identity` (uids, fsuid, SysV clean-up),
`cgroups`, `paths`, `procfs` (/proc), `kill` (the one killer: every signal the agent sends), `process` (the command
handle, running a command), `seccomp` and `spawner_program` (the spawner's program: real modules whose TEXT is run
with `python -I -S -c`), `spawner` (the agent's side of it), `relay_program` (the relay's program, TEXT as well) and
`relay`, `watch` (what the policy observes), `reaper`, `handlers` (`Agent`, the request handlers), `bodies` (the
streamed request and answer bodies of file transfers), `server` (HTTP/1.1), `__main__` (`main`).
"""
