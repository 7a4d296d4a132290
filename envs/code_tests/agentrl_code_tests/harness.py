"""Test harness that runs INSIDE the sandbox: stdlib only, Python 3.8+, no imports from agentrl.

Run as `<python> -I -c "<this file's text>"` (scoring.judge_argv: the sandbox's execute-only interpreter, else
python3) with a JSON spec on stdin (nothing is read from the workspace, so files the model planted there cannot
change the verdict):

    {"prelude": str,        the task's code the solution builds on (HumanEval: the prompt's imports and helpers)
     "solution": str,       the candidate code
     "setup": str,          the test module's top level (imports, helpers the tests use)
     "entry_point": str,    the function under test; bound to `candidate` as well
     "tests": [[name, code], ...],
     "timeout": float,      seconds per test
     "budget": float,       seconds for all tests; tests after it are failed as "not run"
     "nonce": str}          printed in the result line; only this process ever sees it

Who runs what (the verdict cannot be forged by the solution):

- The JUDGE (this process) never executes solution code. It evaluates every test in a fresh namespace built only from
  the task's prelude and setup, where `candidate` / the entry point is a stub that asks a solution process for the
  value of one call: the judge sends the call's arguments and receives the return value as plain data (exact
  builtin types only: None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset, with depth and size
  caps), rebuilt by the judge from JSON, so every comparison, `abs`, `math.isclose`, loop and helper of the test runs
  on values the solution cannot make lie. The solution never sees the tests, the expected values or the nonce.
- The SPAWNER is forked before the spec is read, so its memory holds no test; it receives only the prelude, the
  solution and the entry point, and forks one SOLUTION process per test (own process group; fd 0/1/2 on /dev/null;
  every other inherited fd closed except the pipe it reads calls from and the pipe it writes values on).
- The judge is non-dumpable from its first instruction (a same-uid process can neither ptrace it nor open
  /proc/<pid>/mem or fd/*): the host starts it from the sandbox's execute-only interpreter copy
  (`Sandbox.judge_python`, which the command user can run but not read), and the kernel makes a process started from
  an unreadable binary non-dumpable at its execve. Everything it forks stays so. Its first statement still turns it
  non-dumpable, for sandboxes without that copy (user images, non-root hosts), where the interpreter's start-up
  comes before it and what holds is that it starts only once no policy process is alive (the env kills them all
  first); the result line says which it was (`nondumpable_from_exec`).
- The judge moves its own stdout aside (fd 1 becomes /dev/null) and writes the one result line at the very end:
  RESULT_MARK + nonce + " " + {"results": [[name, passed, message], ...], "nondumpable_from_exec": bool}.

A solution that hangs is killed (with its process group) at the test's timeout; one that crashes, exits, raises or
returns something that is not plain data fails that test with a message saying so.
"""

import sys


def _make_non_dumpable():
    """prctl(PR_SET_DUMPABLE, 0): same-uid processes can no longer ptrace us or open /proc/<pid>/mem, fd/*, environ.
    Inherited by the forks. Returns whether we already were (started from an unreadable interpreter). Best effort
    (not Linux, no libc)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        was = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
        libc.prctl(4, 0, 0, 0, 0)
        return was == 0
    except (ImportError, OSError, AttributeError):
        return False


# First, before any other import: drop the cwd / script dir from sys.path so a planted ctypes.py or json.py cannot
# shadow the stdlib, then turn non-dumpable (ctypes is the only import before that) if exec did not already.
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
NONDUMPABLE_FROM_EXEC = _make_non_dumpable()

import ast  # noqa: E402
import builtins  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402

RESULT_MARK = "AGENTRL_HARNESS_RESULT "
MAX_MESSAGE = 300
MAX_DEPTH = 100  # nesting of a returned value
MAX_ITEMS = 2000000  # scalars + containers in one returned value
MAX_FRAME = 32 * 1024 * 1024  # bytes of one encoded value on the pipe
MAX_INT_BITS = 1000000
SMALL_INT = 1 << 62  # ints at most this big travel as JSON numbers, larger ones as hex
SPAWN_WAIT_S = 10.0
PRELOAD = ("math", "re", "string", "collections", "itertools", "functools", "heapq", "bisect", "typing", "random",
           "copy", "fractions", "decimal", "hashlib", "statistics", "operator")
CHILD_REQ_FD, CHILD_RESP_FD = 3, 4
_HEADER = struct.Struct(">I")


def _short(text, limit=MAX_MESSAGE):
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc):
    if isinstance(exc, (SolutionRaised, SolutionRaisedBase)):
        return _short(exc.shown)
    msg = str(exc)
    return _short(type(exc).__name__ + (": " + msg if msg else ""))


def _safe_repr(value, limit):
    try:
        return _short(repr(value), limit)
    except (ValueError, RecursionError, MemoryError):  # e.g. an int over the str-conversion digit limit
        return "<" + type(value).__name__ + " too large to show>"


# -- plain data on the wire ----------------------------------------------------------------------------------------
# A value is a JSON scalar (null, true/false, number, string) or [tag, payload]: "l" list, "t" tuple, "s" set,
# "f" frozenset, "d" dict ([[key, value], ...]), "b" bytes (hex), "i" big int (hex).

class NotPlainData(Exception):
    """A value that is not made only of the exact builtin types the judge can grade."""


class BadWire(Exception):
    """Bytes from the solution process that are not a valid encoded value."""


_SEQ_TAGS = {list: "l", tuple: "t", set: "s", frozenset: "f"}


def encode(value):
    """`value` as JSON-compatible data; NotPlainData (with a message for the model) if it is not plain data."""
    count = [0]
    return _encode(value, 0, count)


def _encode(x, depth, count):
    count[0] += 1
    if count[0] > MAX_ITEMS:
        raise NotPlainData("more than " + str(MAX_ITEMS) + " items")
    if depth > MAX_DEPTH:
        raise NotPlainData("nested deeper than " + str(MAX_DEPTH) + " levels (or it contains itself)")
    t = type(x)
    if x is None or t is bool or t is str or t is float:
        return x
    if t is int:
        if -SMALL_INT <= x <= SMALL_INT:
            return x
        if x.bit_length() > MAX_INT_BITS:
            raise NotPlainData("an int of more than " + str(MAX_INT_BITS) + " bits")
        return ["i", format(x, "x")]
    if t is bytes:
        return ["b", x.hex()]
    if t in _SEQ_TAGS:
        return [_SEQ_TAGS[t], [_encode(v, depth + 1, count) for v in x]]
    if t is dict:
        return ["d", [[_encode(k, depth + 1, count), _encode(v, depth + 1, count)] for k, v in x.items()]]
    raise NotPlainData("an object of type " + _type_name(t))


def _type_name(t):
    try:
        module = t.__module__
        name = t.__qualname__
    except BaseException:  # noqa: BLE001 - a hostile metaclass; the judge never calls this on solution types
        return "?"
    if not isinstance(module, str) or not isinstance(name, str):
        return "?"
    return _short(name if module == "builtins" else module + "." + name, 80)


def decode(data):
    """The value encoded in `data` (JSON-compatible), built only from exact builtin types; BadWire otherwise."""
    count = [0]
    try:
        return _decode(data, 0, count)
    except (TypeError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        raise BadWire(_describe(exc)) from None


def _decode(x, depth, count):
    count[0] += 1
    if count[0] > MAX_ITEMS or depth > MAX_DEPTH:
        raise BadWire("too big or too deep")
    t = type(x)
    if x is None or t is bool or t is str or t is float:
        return x
    if t is int:
        if not -SMALL_INT <= x <= SMALL_INT:
            raise BadWire("a big int as a JSON number")
        return x
    if t is not list or len(x) != 2 or type(x[0]) is not str:
        raise BadWire("not an encoded value")
    tag, payload = x
    if tag == "i" or tag == "b":
        if type(payload) is not str or (tag == "i" and len(payload) > MAX_INT_BITS // 4 + 2):
            raise BadWire("bad " + tag + " payload")
        return int(payload, 16) if tag == "i" else bytes.fromhex(payload)
    if type(payload) is not list:
        raise BadWire("bad container payload")
    if tag == "d":
        out = {}
        for pair in payload:
            if type(pair) is not list or len(pair) != 2:
                raise BadWire("bad dict item")
            out[_decode(pair[0], depth + 1, count)] = _decode(pair[1], depth + 1, count)
        return out
    builder = {"l": list, "t": tuple, "s": set, "f": frozenset}.get(tag)
    if builder is None:
        raise BadWire("unknown tag")
    return builder([_decode(v, depth + 1, count) for v in payload])


# -- frames: 4-byte length + JSON --------------------------------------------------------------------------------

def send_frame(fd, obj):
    data = json.dumps(obj).encode("utf-8")
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd, n, deadline):
    """`n` bytes from `fd`; None on EOF; raises TestTimeout past `deadline` (None: wait forever)."""
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TestTimeout()
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(fd, deadline=None, limit=MAX_FRAME):
    """The next frame's JSON value; None on EOF; BadWire for an oversized or malformed frame."""
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > limit:
        raise BadWire("a value of " + str(size) + " bytes (the limit is " + str(limit) + ")")
    body = _read_exact(fd, size, deadline)
    if body is None:
        return None
    try:
        return json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError, MemoryError) as exc:
        raise BadWire(_describe(exc)) from None


# -- the solution process (forked by the spawner; runs untrusted code) ---------------------------------------------

def _solution_main(codes, entry_point):
    """Load the solution, then answer calls on CHILD_REQ_FD / CHILD_RESP_FD until EOF. Never returns."""
    try:
        ns = {"__name__": "solution", "__builtins__": builtins}
        exec(codes["prelude"], ns)
        try:
            exec(codes["solution"], ns)
        except BaseException as exc:  # noqa: BLE001 - any failure of the candidate is a failed test
            send_frame(CHILD_RESP_FD, ["load_error", "the solution raised while loading: " + _describe(exc)])
            os._exit(0)
        function = ns.get(entry_point)
        if not callable(function):
            send_frame(CHILD_RESP_FD, ["load_error", "the solution does not define " + entry_point + "()"])
            os._exit(0)
        send_frame(CHILD_RESP_FD, ["ready"])
        while True:
            request = recv_frame(CHILD_REQ_FD)
            if request is None:
                break
            send_frame(CHILD_RESP_FD, _answer(function, decode(request[0]), decode(request[1])))
    except BaseException:  # noqa: BLE001 - the judge sees EOF and fails the test
        pass
    os._exit(0)


def _answer(function, args, kwargs):
    try:
        value = function(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the judge as what the call raised
        return ["raise", type(exc).__name__, _short(str(exc)), isinstance(exc, Exception)]
    try:
        return ["ok", encode(value)]
    except NotPlainData as exc:
        return ["not_plain", "returned " + str(exc) + "; only plain data (None, bool, int, float, str, bytes, list, "
                "tuple, dict, set, frozenset) can be graded"]
    except BaseException as exc:  # noqa: BLE001 - e.g. a dict whose iteration the solution broke
        return ["not_plain", "returned a value that could not be read: " + _describe(exc)]


def _become_solution_process(req_fd, resp_fd, sock):
    """In the freshly forked child: own process group, fd 3 = calls in, fd 4 = values out, nothing else open."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sock.detach()  # the socket object must not close fd 3/4 later
    req, resp = os.dup(req_fd), os.dup(resp_fd)
    os.dup2(req, CHILD_REQ_FD)
    os.dup2(resp, CHILD_RESP_FD)
    _close_fds_from(CHILD_RESP_FD + 1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _close_fds_from(low, keep=-1):
    """Close every open fd >= `low` except `keep`: the ones /proc/self/fd lists (fast even under a 1M fd limit),
    else the whole range up to the fd limit."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        names = None
    if names is None:
        os.closerange(low, keep if keep >= low else _max_fd())
        if keep >= low:
            os.closerange(keep + 1, _max_fd())
        return
    for name in names:
        fd = int(name)
        if fd >= low and fd != keep:
            try:
                os.close(fd)
            except OSError:  # the fd listdir itself used, already closed
                pass


def _max_fd():
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return soft if 0 < soft < (1 << 20) else (1 << 20)
    except (ImportError, ValueError, OSError):
        return 65536


# -- the spawner (forked before the spec is read; never runs solution code itself) ---------------------------------

def _spawner_main(sock):
    """Receive the codes once ("load" + a pipe to read them from), then fork one solution process per "spawn"
    request (its two pipe ends arrive with SCM_RIGHTS) and answer with the child's pid."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    codes, entry_point = None, None
    while True:
        try:
            msg, ancillary, _, _ = sock.recvmsg(64, socket.CMSG_SPACE(2 * 4))
        except OSError:
            break
        if not msg:
            break
        received = _fds_of(ancillary)
        if msg == b"load" and len(received) == 1:
            codes, entry_point = _read_codes(received[0])
        elif msg == b"spawn" and len(received) == 2 and codes is not None:
            pid = os.fork()
            if pid == 0:
                _become_solution_process(received[0], received[1], sock)
                _solution_main(codes, entry_point)
            sock.send(_HEADER.pack(pid))
        for fd in received:
            os.close(fd)
    os._exit(0)


def _fds_of(ancillary):
    fds = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // 4}i", data[: len(data) - len(data) % 4]))
    return fds


def _read_codes(fd):
    """Compile the prelude and the solution sent by the judge on the pipe `fd` (JSON, until EOF)."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    spec = json.loads(b"".join(chunks).decode("utf-8"))
    codes = {}
    for key, filename in (("prelude", "<task>"), ("solution", "solution.py")):
        codes[key] = compile(spec[key], filename, "exec")
    return codes, spec["entry_point"]


# -- the judge ------------------------------------------------------------------------------------------------------

class TestTimeout(BaseException):
    """The test's time is up (raised by the timer or while waiting for the solution process)."""


class SolutionRaised(Exception):
    """The solution's call raised an Exception that is not a builtin one; `shown` is 'Type: message'."""

    def __init__(self, shown):
        Exception.__init__(self, shown)
        self.shown = shown


class SolutionRaisedBase(BaseException):
    """The solution's call raised a BaseException that is not an Exception (SystemExit, KeyboardInterrupt)."""

    def __init__(self, shown):
        BaseException.__init__(self, shown)
        self.shown = shown


class TestFailed(Exception):
    """A failure of the solution process that is not an exception of the call (died, sent junk, not plain data)."""


class Spawner:
    """The judge's handle on the spawner process."""

    def __init__(self):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            self.sock.close()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            _close_fds_from(3, keep=theirs.fileno())  # the judge's result fd among them
            _spawner_main(theirs)
        theirs.close()
        self.alive = True

    def load(self, prelude, solution, entry_point):
        """Send the code every solution process starts from (never a test, never the nonce)."""
        data = json.dumps({"prelude": prelude, "solution": solution, "entry_point": entry_point}).encode("utf-8")
        read_fd, write_fd = os.pipe()
        try:
            self.sock.sendmsg([b"load"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", read_fd))])
            os.close(read_fd)
            read_fd = -1
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view):]
        except OSError:
            self.alive = False
        finally:
            os.close(write_fd)
            if read_fd >= 0:
                os.close(read_fd)

    def spawn(self):
        """A new solution process: (pid, fd to write calls to, fd to read values from)."""
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        try:
            self.sock.sendmsg([b"spawn"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("2i", req_r, resp_w))])
            ready = select.select([self.sock], [], [], SPAWN_WAIT_S)[0]
            head = self.sock.recv(64) if ready else None
        except OSError:
            head = None
        finally:
            os.close(req_r)
            os.close(resp_w)
        if not head or len(head) != _HEADER.size:
            self.alive = False
            os.close(req_w)
            os.close(resp_r)
            return None
        return _HEADER.unpack(head)[0], req_w, resp_r

    def close(self):
        self.sock.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except OSError:
            pass


class SolutionProcess:
    """One test's solution process, as the judge sees it: calls go out as arguments, values come back as data."""

    def __init__(self, pid, req_fd, resp_fd, deadline):
        self.pid, self.req_fd, self.resp_fd, self.deadline = pid, req_fd, resp_fd, deadline

    def wait_ready(self):
        reply = self._receive()
        if reply == ["ready"]:
            return None
        if type(reply) is list and len(reply) == 2 and reply[0] == "load_error" and type(reply[1]) is str:
            return _short(reply[1])
        raise TestFailed("the solution process sent an invalid reply while loading")

    def call(self, args, kwargs):
        try:
            request = [encode(args), encode(kwargs)]
        except NotPlainData as exc:
            raise TestFailed(
                "harness: the test passes " + str(exc) + " to the solution, which cannot be sent") from None
        try:
            send_frame(self.req_fd, request)
        except OSError:
            raise TestFailed("the solution process ended (it exited or crashed) before the call") from None
        return self._value(self._receive())

    def _receive(self):
        try:
            reply = recv_frame(self.resp_fd, self.deadline)
        except BadWire as exc:
            raise TestFailed("the solution process sent an invalid value: " + str(exc)) from None
        if reply is None:
            raise TestFailed("the solution process ended (exit, crash or out of memory) before returning a value")
        return reply

    def _value(self, reply):
        kind = reply[0] if type(reply) is list and reply else None
        if kind == "ok" and len(reply) == 2:
            try:
                return decode(reply[1])
            except BadWire as exc:
                raise TestFailed("the solution process sent an invalid value: " + str(exc)) from None
        if kind == "not_plain" and len(reply) == 2 and type(reply[1]) is str:
            raise TestFailed(_short(reply[1]))
        if kind == "raise" and len(reply) == 4 and type(reply[1]) is str and type(reply[2]) is str:
            raise _rebuild_exception(reply[1], reply[2], reply[3] is True)
        raise TestFailed("the solution process sent an invalid reply")

    def close(self):
        for fd in (self.req_fd, self.resp_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        for kill, target in ((os.killpg, self.pid), (os.kill, self.pid)):
            try:
                kill(target, signal.SIGKILL)
            except OSError:
                pass


def _rebuild_exception(name, message, is_exception):
    """A judge-made exception for what the solution raised: the builtin class of that name when there is one (a
    test may catch it), else SolutionRaised / SolutionRaisedBase."""
    shown = _short(name + (": " + message if message else ""))
    cls = getattr(builtins, name, None) if name.isidentifier() else None
    if is_exception and isinstance(cls, type) and issubclass(cls, Exception) and cls.__module__ == "builtins":
        try:
            return cls(message)
        except BaseException:  # noqa: BLE001 - a builtin that wants other arguments (UnicodeDecodeError)
            pass
    return SolutionRaised(shown) if is_exception else SolutionRaisedBase(shown)


class _EqAsserts(ast.NodeTransformer):
    """`assert A == B[, msg]` -> `__agentrl_assert_eq__(A, B)`: same evaluation order, plus an expected/got message."""

    def visit_Assert(self, node):
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            call = ast.Call(func=ast.Name(id="__agentrl_assert_eq__", ctx=ast.Load()),
                            args=[test.left, test.comparators[0]], keywords=[])
            return ast.copy_location(ast.Expr(value=call), node)
        return node


def _assert_eq(got, expected):
    if not got == expected:
        raise AssertionError("expected " + _safe_repr(expected, 140) + ", got " + _safe_repr(got, 140))


def compile_test(name, test_code):
    tree = _EqAsserts().visit(ast.parse(test_code, "<test " + name + ">"))
    return compile(ast.fix_missing_locations(tree), "<test " + name + ">", "exec")


_ALARM = {"armed": False}  # a late one-shot alarm after the test is over must not raise anywhere


def _on_alarm(signum, frame):
    if _ALARM["armed"]:
        raise TestTimeout()


def run_test(spawner, codes, entry_point, test, timeout):
    """One test: a fresh solution process, the test evaluated here on the values it returns. (passed, message).

    The alarm is one-shot and may fire at any bytecode until it is disarmed, also after the test already stopped
    on the same deadline (the solution process's own read deadline), while its verdict is being formed, or on
    entering a function: while armed that is a timeout, caught by the outer `except` wherever it lands, and once
    disarmed (`_ALARM`) the handler does nothing. Never an exception out of the harness (which would lose every
    test's report)."""
    deadline = time.monotonic() + timeout
    spawned = spawner.spawn() if spawner.alive else None
    if spawned is None:
        return False, "not run: the solution killed the harness's process spawner in an earlier test"
    proc = SolutionProcess(spawned[0], spawned[1], spawned[2], deadline)
    try:
        try:
            _ALARM["armed"] = True
            signal.setitimer(signal.ITIMER_REAL, timeout)
            return _run_test_body(proc, codes, entry_point, test, timeout)
        finally:
            _ALARM["armed"] = False  # an alarm before this line raised here and is caught below; after it, a no-op
    except TestTimeout:  # one-shot: this was the alarm (or the read deadline), there is no second one
        return False, _timed_out(timeout)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        proc.close()


def _timed_out(timeout):
    return "timed out after " + format(timeout, "g") + "s"


def _run_test_body(proc, codes, entry_point, test, timeout):
    try:
        load_error = proc.wait_ready()
        if load_error is not None:
            return False, load_error
        ns = {"__name__": "__agentrl_test__", "__builtins__": builtins}
        exec(codes["prelude"], ns)
        exec(codes["setup"], ns)
        ns["__agentrl_assert_eq__"] = _assert_eq
        ns["candidate"] = ns[entry_point] = _stub(proc, entry_point)
        exec(test, ns)
        return True, ""
    except TestTimeout:
        return False, _timed_out(timeout)
    except TestFailed as exc:
        return False, _short(str(exc))
    except BaseException as exc:  # noqa: BLE001 - the assertion failed or the test raised on the values
        return False, _describe(exc)


def _stub(proc, entry_point):
    def candidate(*args, **kwargs):
        return proc.call(args, kwargs)

    candidate.__name__ = candidate.__qualname__ = entry_point
    return candidate


def _compile_all(spec):
    """Compile everything once (compiling runs no code): a syntax error fails every test with one clear message."""
    codes = {}
    for key, filename in (("prelude", "<task>"), ("solution", "solution.py"), ("setup", "<tests>")):
        try:
            codes[key] = compile(spec.get(key) or "", filename, "exec")
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
            who = "the solution" if key == "solution" else "the task's " + key
            return None, who + " does not compile: " + _describe(exc)
    return codes, None


def run_all(spec, spawner):
    timeout = float(spec["timeout"])
    deadline = time.monotonic() + float(spec["budget"])
    codes, error = _compile_all(spec)
    if error is None:
        spawner.load(spec.get("prelude") or "", spec.get("solution") or "", spec["entry_point"])
    results = []
    for name, test_code in spec["tests"]:
        if error is not None:
            results.append([name, False, error])
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            results.append([name, False, "not run: the time budget for all tests was used up"])
            continue
        try:
            test = compile_test(name, test_code)
        except (SyntaxError, ValueError, RecursionError) as exc:
            results.append([name, False, "the test does not compile: " + _describe(exc)])
            continue
        passed, message = run_test(spawner, codes, spec["entry_point"], test, min(timeout, left))
        results.append([name, passed, message])
    return results


def main():
    for module in PRELOAD:  # imported once here, inherited by the spawner and every solution process
        try:
            __import__(module)
        except ImportError:
            pass
    os.chdir("/")
    report_fd = os.dup(1)  # the only way to the result line; fd 1 becomes /dev/null so nothing else lands there
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.close(devnull)
    signal.signal(signal.SIGALRM, _on_alarm)
    spawner = Spawner()  # before the spec is read: the spawner's memory holds no test and no nonce
    spec = json.loads(sys.stdin.read())
    os.close(0)
    try:
        results = run_all(spec, spawner)
    finally:
        spawner.close()
    report = {"results": results, "nondumpable_from_exec": NONDUMPABLE_FROM_EXEC}
    line = RESULT_MARK + str(spec.get("nonce", "")) + " " + json.dumps(report) + "\n"
    view = memoryview(line.encode("utf-8"))
    while view:
        view = view[os.write(report_fd, view):]


if __name__ == "__main__":
    main()
