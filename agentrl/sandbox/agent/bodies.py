"""The bodies of requests and answers that are streamed, not held: `Reader` (buffered reads from a connection, which
the server parses request heads with), `BodyStream` (PUT /file's body, read from the connection as it is written)
and `FileBody` (GET /file's answer, sent from the file's descriptor)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

from .protocol import FILE_CHANGED, FILE_CHUNK, FILE_DONE

CHUNK = 1 << 16


class FileBody:
    """The answer of GET /file: `size` bytes (the file's size by fstat once opened) sent from the descriptor
    FILE_CHUNK bytes at a time through one reused buffer, then one status byte: b"." when the file still had
    exactly `size` bytes at the end, b"!" when it changed size while read or a read failed (zero-padded to `size`
    first, so the answer always has its announced length: the host is never left waiting, and never takes a
    short file for the whole one). Owns `fd` until send() returns (or close() when it is never sent)."""

    DONE, CHANGED = FILE_DONE, FILE_CHANGED

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size

    def __len__(self) -> int:
        return self.size + 1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def send(self, conn: socket.socket, head: bytes) -> None:
        try:
            conn.sendall(head)
            buf = memoryview(bytearray(min(FILE_CHUNK, max(self.size, 1))))
            sent, status = 0, self.DONE
            while sent < self.size:
                want = min(len(buf), self.size - sent)
                try:
                    n = os.readv(self.fd, [buf[:want]]) if status == self.DONE else 0
                except OSError:
                    n = 0
                if n == 0:  # shrank (or unreadable): pad, so the answer keeps its announced length
                    status = self.CHANGED
                    buf[:want] = bytes(want)
                    n = want
                conn.sendall(buf[:n])
                sent += n
            if status == self.DONE:
                try:
                    grew = os.fstat(self.fd).st_size != self.size or os.pread(self.fd, 1, self.size) != b""
                except OSError:
                    grew = True
                status = self.CHANGED if grew else self.DONE
            conn.sendall(status)
        finally:
            self.close()


class BodyStream:
    """The body of a PUT /file request, read from the connection as it is used: chunks() yields it at most
    FILE_CHUNK bytes at a time through one reused buffer; drain() reads and drops what is left (an error answered
    before the whole body was used), so the connection stays in step for the next request."""

    def __init__(self, reader: Reader, length: int) -> None:
        self.reader, self.left = reader, length
        self._buf: memoryview | None = None

    def chunks(self) -> Iterator[memoryview]:
        while self.left:
            if self.reader.buf:  # what arrived with the head comes first
                take = bytes(self.reader.buf[:self.left])
                del self.reader.buf[:len(take)]
                self.left -= len(take)
                yield memoryview(take)
                continue
            if self._buf is None:
                self._buf = memoryview(bytearray(min(FILE_CHUNK, self.left)))
            n = self.reader.conn.recv_into(self._buf, min(len(self._buf), self.left))
            if n == 0:
                raise ConnectionAbortedError(f"the request body ended {self.left} bytes early")
            self.left -= n
            yield self._buf[:n]

    def drain(self) -> bool:
        """Read and drop the rest of the body; False when the connection ended first."""
        try:
            for _ in self.chunks():
                pass
        except OSError:
            return False
        return True


class Reader:
    """Buffered reads from a connection, starting with the bytes the acceptor already received."""

    def __init__(self, conn: socket.socket, initial: bytes = b"") -> None:
        self.conn = conn
        self.buf = bytearray(initial)

    def _fill(self) -> bool:
        data = self.conn.recv(CHUNK)
        self.buf += data
        return bool(data)

    def readline(self, limit: int) -> bytes:
        """Up to and including the next b"\\n"; fewer bytes at EOF; `limit` bytes when the line is longer."""
        scanned = 0
        while True:
            i = self.buf.find(b"\n", scanned, limit)
            if i >= 0:
                n = i + 1
                break
            if len(self.buf) >= limit:
                n = limit
                break
            scanned = len(self.buf)
            if not self._fill():
                n = len(self.buf)
                break
        line = bytes(self.buf[:n])
        del self.buf[:n]
        return line

    def read(self, n: int) -> bytes | bytearray:
        """Exactly `n` bytes, fewer only at EOF."""
        if len(self.buf) >= n:
            head = bytes(self.buf[:n])
            del self.buf[:n]
            return head
        out, self.buf = self.buf, bytearray()
        while len(out) < n:
            data = self.conn.recv(min(n - len(out), 1 << 20))
            if not data:
                break
            out += data
        return out
