# agentrl syscall policy
"""The syscall policy every command runs under, on every backend (docs/reward-integrity.md, "The syscall policy"): a
classic-BPF seccomp filter that the command spawner installs on itself before it serves (so every command it starts
inherits it; no per-command cost). Part of the spawner's program (its TEXT comes first in spawner.SPAWNER_PROGRAM)
and imported by the agent for the names of the calls it observes (`SeccompWatch`). Stdlib only (ctypes). An
allow-list per architecture (x86_64, aarch64; any other architecture, and x32 numbers, are refused): ALLOWED's
families are what a task's programs need; `clone` only without namespace flags, `socket` not for AF_VSOCK; `clone3`
(whose flags the filter cannot read) answers ENOSYS so libc falls back to clone. Everything else is refused: the
PROBES (a task never needs them: kernel keyrings, ptrace and reading other processes, mounts and namespaces, bpf,
perf, userfaultfd, kexec and modules, io_uring) with EPERM, the rest (calls newer or rarer than this list) with
ENOSYS, so programs that probe for them fall back. With `notify` the refusals go to a listener
(SECCOMP_RET_USER_NOTIF) instead: the agent answers them with the same errno and counts them, so probing is seen as
well as blocked; the SIGNALS (every call that can signal another process) go there as well on Linux >= 5.5 and are
let through (SeccompWatch, SignalTargets). Each table entry is NAME:X86_64_NR:AARCH64_NR (-1: not on that
architecture).

A program module: it imports only builtins and ctypes, and no `from __future__` (its text runs with
`python -I -S -c`, concatenated with spawner_program.py)."""

import ctypes
import os

ALLOWED = {}
ALLOWED["processes"] = """
    execve:59:221 execveat:322:281 exit:60:93 exit_group:231:94 fork:57:-1 vfork:58:-1 clone:56:220 wait4:61:260
    waitid:247:95 set_tid_address:218:96 set_robust_list:273:99 get_robust_list:274:100 rseq:334:293
    restart_syscall:219:128 arch_prctl:158:-1 prctl:157:167 getpid:39:172 getppid:110:173 gettid:186:178
    getpgid:121:155 setpgid:109:154 getpgrp:111:-1 getsid:124:156 setsid:112:157 capget:125:90 capset:126:91
    personality:135:92 seccomp:317:277 membarrier:324:283 sched_yield:24:124 sched_getaffinity:204:123
    sched_setaffinity:203:122 sched_getparam:143:121 sched_setparam:142:118 sched_getscheduler:145:120
    sched_setscheduler:144:119 sched_get_priority_max:146:125 sched_get_priority_min:147:126
    sched_rr_get_interval:148:127 sched_getattr:315:275 sched_setattr:314:274 getpriority:140:141
    setpriority:141:140 ioprio_get:252:31 ioprio_set:251:30 getrusage:98:165 getrlimit:97:163 setrlimit:160:164
    prlimit64:302:261 umask:95:166 uname:63:160 sysinfo:99:179 times:100:153 getcpu:309:168 getrandom:318:278
    landlock_create_ruleset:444:444 landlock_add_rule:445:445 landlock_restrict_self:446:446"""
ALLOWED["ids"] = """
    getuid:102:174 geteuid:107:175 getgid:104:176 getegid:108:177 getresuid:118:148 getresgid:120:150
    getgroups:115:158 setuid:105:146 setgid:106:144 setreuid:113:145 setregid:114:143 setresuid:117:147
    setresgid:119:149 setgroups:116:159 setfsuid:122:151 setfsgid:123:152"""
ALLOWED["memory"] = """
    brk:12:214 mmap:9:222 munmap:11:215 mprotect:10:226 mremap:25:216 madvise:28:233 mincore:27:232 msync:26:227
    mlock:149:228 mlock2:325:284 munlock:150:229 mlockall:151:230 munlockall:152:231 memfd_create:319:279
    pkey_alloc:330:289 pkey_free:331:290 pkey_mprotect:329:288 remap_file_pages:216:234 mbind:237:235
    get_mempolicy:239:236 set_mempolicy:238:237 mseal:462:462 map_shadow_stack:453:453"""
ALLOWED["files"] = """
    read:0:63 write:1:64 readv:19:65 writev:20:66 pread64:17:67 pwrite64:18:68 preadv:295:69 pwritev:296:70
    preadv2:327:286 pwritev2:328:287 open:2:-1 openat:257:56 openat2:437:437 creat:85:-1 close:3:57
    close_range:436:436 lseek:8:62 dup:32:23 dup2:33:-1 dup3:292:24 fcntl:72:25 flock:73:32 fsync:74:82
    fdatasync:75:83 syncfs:306:267 sync:162:81 sync_file_range:277:84 fallocate:285:47 fadvise64:221:223
    readahead:187:213 ftruncate:77:46 truncate:76:45 stat:4:-1 fstat:5:80 lstat:6:-1 newfstatat:262:79 statx:332:291
    statfs:137:43 fstatfs:138:44 access:21:-1 faccessat:269:48 faccessat2:439:439 getcwd:79:17 chdir:80:49
    fchdir:81:50 mkdir:83:-1 mkdirat:258:34 rmdir:84:-1 rename:82:-1 renameat:264:38 renameat2:316:276 link:86:-1
    linkat:265:37 symlink:88:-1 symlinkat:266:36 unlink:87:-1 unlinkat:263:35 readlink:89:-1 readlinkat:267:78
    chmod:90:-1 fchmod:91:52 fchmodat:268:53 fchmodat2:452:452 chown:92:-1 fchown:93:55 lchown:94:-1 fchownat:260:54
    utime:132:-1 utimes:235:-1 utimensat:280:88 futimesat:261:-1 getdents:78:-1 getdents64:217:61 mknod:133:-1
    mknodat:259:33 getxattr:191:8 lgetxattr:192:9 fgetxattr:193:10 setxattr:188:5 lsetxattr:189:6 fsetxattr:190:7
    listxattr:194:11 llistxattr:195:12 flistxattr:196:13 removexattr:197:14 lremovexattr:198:15 fremovexattr:199:16
    getxattrat:464:464 setxattrat:463:463 listxattrat:465:465 removexattrat:466:466 sendfile:40:71 splice:275:76
    tee:276:77 vmsplice:278:75 copy_file_range:326:285 ioctl:16:29 name_to_handle_at:303:-1 cachestat:451:451
    inotify_init:253:-1 inotify_init1:294:26 inotify_add_watch:254:27 inotify_rm_watch:255:28"""
ALLOWED["waiting"] = """
    pipe:22:-1 pipe2:293:59 poll:7:-1 ppoll:271:73 select:23:-1 pselect6:270:72 epoll_create:213:-1
    epoll_create1:291:20 epoll_ctl:233:21 epoll_wait:232:-1 epoll_pwait:281:22 epoll_pwait2:441:441 eventfd:284:-1
    eventfd2:290:19 signalfd:282:-1 signalfd4:289:74 timerfd_create:283:85 timerfd_settime:286:86
    timerfd_gettime:287:87 futex:202:98 futex_waitv:449:449 futex_wake:454:454 futex_wait:455:455
    futex_requeue:456:456 io_setup:206:0 io_destroy:207:1 io_submit:209:2 io_cancel:210:3 io_getevents:208:4
    io_pgetevents:333:292"""
ALLOWED["time"] = """
    nanosleep:35:101 clock_nanosleep:230:115 clock_gettime:228:113 clock_getres:229:114 gettimeofday:96:169
    time:201:-1 alarm:37:-1 getitimer:36:102 setitimer:38:103 timer_create:222:107 timer_settime:223:110
    timer_gettime:224:108 timer_getoverrun:225:109 timer_delete:226:111 pause:34:-1"""
ALLOWED["signals"] = """
    rt_sigaction:13:134 rt_sigprocmask:14:135 rt_sigreturn:15:139 rt_sigpending:127:136 rt_sigsuspend:130:133
    rt_sigtimedwait:128:137 sigaltstack:131:132 pidfd_open:434:434"""
# every call that can signal another process: allowed, but in notify mode (kernel >= 5.5) each goes to the listener
# first, which looks at the target and lets the kernel go on (SECCOMP_USER_NOTIF_FLAG_CONTINUE: the kernel's own
# permission check decides, the count grants nothing). pidfd_open is not among them: a pidfd signals nothing by
# itself (pidfd_send_signal is watched; pidfd_getfd, process_madvise and setns are refused), and the spawner opens
# one per command, which would cost every exec a round trip.
SIGNALS = """
    kill:62:129 tkill:200:130 tgkill:234:131 rt_sigqueueinfo:129:138 rt_tgsigqueueinfo:297:240
    pidfd_send_signal:424:424"""
# and the calls that name the process the kernel signals on a descriptor's I/O (SIGIO / F_SETSIG's): fcntl and ioctl
# go to the listener with these commands only (args[1]), every other fcntl and ioctl stays allowed
OWNER_CMDS = {"fcntl": (8, 15), "ioctl": (0x8901, 0x8902)}  # F_SETOWN, F_SETOWN_EX; FIOSETOWN, SIOCSPGRP
ALLOWED["ipc"] = """
    shmget:29:194 shmat:30:196 shmdt:67:197 shmctl:31:195 semget:64:190 semop:65:193 semtimedop:220:192
    semctl:66:191 msgget:68:186 msgsnd:69:189 msgrcv:70:188 msgctl:71:187 mq_open:240:180 mq_unlink:241:181
    mq_timedsend:242:182 mq_timedreceive:243:183 mq_notify:244:184 mq_getsetattr:245:185"""
ALLOWED["network"] = """
    socket:41:198 socketpair:53:199 bind:49:200 listen:50:201 accept:43:202 accept4:288:242 connect:42:203
    getsockname:51:204 getpeername:52:205 sendto:44:206 recvfrom:45:207 sendmsg:46:211 recvmsg:47:212
    sendmmsg:307:269 recvmmsg:299:243 shutdown:48:210 setsockopt:54:208 getsockopt:55:209"""
PROBES = """
    add_key:248:217 request_key:249:218 keyctl:250:219 ptrace:101:117 process_vm_readv:310:270
    process_vm_writev:311:271 pidfd_getfd:438:438 process_madvise:440:440 process_mrelease:448:448 kcmp:312:272
    mount:165:40 umount2:166:39 pivot_root:155:41 chroot:161:51 unshare:272:97 setns:308:268 open_tree:428:428
    open_tree_attr:467:467 move_mount:429:429 fsopen:430:430 fsconfig:431:431 fsmount:432:432 fspick:433:433
    mount_setattr:442:442 bpf:321:280 perf_event_open:298:241
    userfaultfd:323:282 kexec_load:246:104 kexec_file_load:320:294 init_module:175:105 finit_module:313:273
    delete_module:176:106 io_uring_setup:425:425 io_uring_enter:426:426 io_uring_register:427:427"""
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, the table's column
X32_BIT = 0x40000000
CLONE3 = {"x86_64": 435, "aarch64": 435}
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
CLONE_NAMESPACES = 0x7E020000  # NEWNS NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET
AF_VSOCK = 40  # not in any network namespace: it would reach the host's (or the VM host's) vsock services
RET_ALLOW, RET_NOTIFY, RET_ERRNO = 0x7FFF0000, 0x7FC00000, 0x00050000
EPERM, ENOSYS = 1, 38


def table(text, column):
    return {f.split(":")[0]: int(f.split(":")[1 + column]) for f in text.split()}


def numbers(arch):
    """({allowed nr}, {probe nr}) of `arch`, x86_64 or aarch64."""
    col = ARCHES[arch][1]
    allowed = {nr for text in ALLOWED.values() for nr in table(text, col).values() if nr >= 0}
    return allowed, {nr for nr in table(PROBES, col).values() if nr >= 0}


def signals(arch):
    """{signalling call nr} of `arch` (SIGNALS)."""
    return {nr for nr in table(SIGNALS, ARCHES[arch][1]).values() if nr >= 0}


def names(arch):
    col = ARCHES[arch][1]
    out = {nr: name for text in (*ALLOWED.values(), SIGNALS) for name, nr in table(text, col).items() if nr >= 0}
    out.update({nr: name for name, nr in table(PROBES, col).items() if nr >= 0})
    return out


def _section(arch, probe, other, signal=RET_ALLOW):
    """One architecture's instructions (labels resolved by `program`): seccomp_data.nr checked for x32, clone,
    clone3, the probes and the SIGNALS (`signal`: watched or allowed), then against the allow-list (sorted ranges,
    two jumps each); the rest is refused."""
    allowed, probes = numbers(arch)
    clone = table(ALLOWED["processes"], ARCHES[arch][1])["clone"]
    sock = table(ALLOWED["network"], ARCHES[arch][1])["socket"]
    owners = {name: table(ALLOWED["files"], ARCHES[arch][1])[name] for name in OWNER_CMDS}
    allowed -= {clone, sock, *owners.values()}
    ranges, ins = [], [(0x20, None, None, 0)]  # ld nr
    for nr in sorted(allowed):
        if ranges and ranges[-1][1] == nr - 1:
            ranges[-1][1] = nr
        else:
            ranges.append([nr, nr])
    if arch == "x86_64":
        ins.append((0x35, "probe", None, X32_BIT))  # jge: an x32 call
    for name, nr in owners.items():  # nr: args[1] (low word) against each command; the others go on with nr
        ins += [(0x15, None, f"not_{name}", nr), (0x20, None, None, 24),
                *[(0x15, f"{name}_signal", None, c) for c in OWNER_CMDS[name]], (0x06, None, None, RET_ALLOW),
                (f"{name}_signal",), (0x06, None, None, signal), (f"not_{name}",)]
    ins += [(0x15, "clone", None, clone), (0x15, "socket", None, sock), (0x15, "enosys", None, CLONE3[arch])]
    ins += [(0x15, "probe", None, nr) for nr in sorted(probes)]
    ins += [(0x15, "signal", None, nr) for nr in sorted(signals(arch))]
    for lo, hi in ranges:
        ins += [(0x35, None, "other", lo), (0x25, None, "allow", hi)]  # jge lo / jgt hi
    ins += [("other",), (0x06, None, None, other), ("allow",), (0x06, None, None, RET_ALLOW), ("probe",),
            (0x06, None, None, probe), ("enosys",), (0x06, None, None, RET_ERRNO | ENOSYS), ("clone",),
            (0x20, None, None, 16), (0x45, None, "clone_ok", CLONE_NAMESPACES),  # ld args[0] (low word); jset
            (0x06, None, None, probe), ("clone_ok",), (0x06, None, None, RET_ALLOW), ("socket",),
            (0x20, None, None, 16), (0x15, None, "socket_ok", AF_VSOCK),  # ld args[0]; jeq
            (0x06, None, None, probe), ("socket_ok",), (0x06, None, None, RET_ALLOW), ("signal",),
            (0x06, None, None, signal)]
    return _resolve(ins)


def _resolve(ins):
    labels, out = {}, []
    for i in ins:
        if len(i) == 1:
            labels[i[0]] = len(out)
        else:
            out.append(i)
    code = []
    for at, (op, jt, jf, k) in enumerate(out):
        jt, jf = (0 if j is None else labels[j] - at - 1 for j in (jt, jf))
        assert 0 <= jt < 256 and 0 <= jf < 256, "a jump too far for classic BPF"
        code.append((op, jt, jf, k))
    return code


def program(notify, watch_signals=False):
    """The whole filter: the architecture check, then one section per known architecture. `watch_signals` (notify
    only): the SIGNALS go to the listener too (it answers them with SECCOMP_USER_NOTIF_FLAG_CONTINUE)."""
    probe = RET_NOTIFY if notify else RET_ERRNO | EPERM
    other = RET_NOTIFY if notify else RET_ERRNO | ENOSYS
    signal = RET_NOTIFY if notify and watch_signals else RET_ALLOW
    x86, arm = _section("x86_64", probe, other, signal), _section("aarch64", probe, other, signal)
    head = [(0x20, 0, 0, 4), (0x15, 2, 0, ARCHES["x86_64"][0]), (0x15, 1 + len(x86), 0, ARCHES["aarch64"][0]),
            (0x06, 0, 0, probe)]
    return b"".join(op.to_bytes(2, "little") + bytes((jt, jf)) + k.to_bytes(4, "little")
                    for op, jt, jf, k in head + x86 + arm)


def install(libc, notify=True):
    """Install the filter on this process (and so on everything it starts from now on; needs no_new_privs).
    Returns (listener fd or -1, mode): mode "notify" (refusals go to the listener), "errno" (refused silently:
    the kernel has no user notification or a listener is already set up above us) or "none: why"."""
    arch = os.uname().machine
    if arch not in ARCHES:
        return -1, f"none: no policy for {arch}"

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    why = ""
    # SECCOMP_USER_NOTIF_FLAG_CONTINUE came with Linux 5.5: before it a watched signal could not be let through
    release = [int("0" + "".join(c for c in part if c.isdigit())) for part in os.uname().release.split(".")[:2]]
    watch_signals = release >= [5, 5]
    for listen in ((True, False) if notify else (False,)):
        code = program(listen, watch_signals)
        prog = Prog(len(code) // 8, code)
        fd = libc.syscall(ctypes.c_long(SYS_SECCOMP[arch]), ctypes.c_long(1), ctypes.c_long(8 if listen else 0),
                          ctypes.byref(prog))
        if fd >= 0:
            return (fd, "notify") if listen else (-1, "errno")
        why = os.strerror(ctypes.get_errno())
    return -1, f"none: seccomp: {why}"
