"""Large buffers between processes of one host through shared memory, not the socket.

On a Unix socket whose two sides agreed to it in the hello, an out-of-band buffer of
:data:`MIN_BYTES` or more travels as a memfd (an anonymous file in memory, never a name
in /dev/shm) passed with SCM_RIGHTS, and the receiver maps it read-only: the bytes never
cross the socket. The kernel frees the memory when the last process holding the file or
a mapping of it lets go, also when that process crashes or is killed.

Repeated transfers touch no new pages. A sender writes into *segments* (memfds of a fixed
size, sealed against shrinking and growing) that it keeps and reuses, and a receiver keeps
its mapping of a segment while the sender keeps the segment, so the same pages and page
tables serve round after round. Who may still read a segment is told by open file
description (OFD) locks, which the kernel drops when the last holder closes or dies:

- Each buffer is passed as a *reader's description* of its segment holding a read lock on
  its bytes: the lock travels with the description to every process it is passed to, and
  lasts while any of them holds it. A receiver holds it exactly while an array made from
  the buffer lives (its mapping goes through a description of its own, unlocked).
- The sender reuses a segment only once it can take a write lock on it (no reader's lock
  left), and writes it under that lock. So a segment is never written while anyone could
  still read the buffer it holds, however a reader ends.
- The sender's own description of a segment holds a read lock on the byte at
  :data:`_KEPT_AT`: a receiver keeps an idle mapping only while that lock is there. A
  sender that drops a segment frees its pages at once (a hole punched over all of it), so
  an idle receiver's mapping of it holds no memory until it notices and unmaps.

Segments are advised for transparent huge pages (``MADV_HUGEPAGE``). Where the kernel gives
shared memory huge pages (``shmem_enabled`` ``advise`` or ``always``; its default is
``never``), a receiver whose last array on a segment goes drops its page tables of it
(``MADV_DONTNEED``; the pages stay while the sender keeps them): mapping a 64 MiB segment
again then costs 32 faults, one per 2 MiB page, so an actor holds only the parameters it
reads. With 4 KiB pages it would cost about 1,000 faults (3-80 ms) per update, so there
receivers keep their page tables of idle segments.

A value sent to many readers costs one copy:

- A read-only buffer (``array.setflags(write=False)``, a received array) is written into
  a segment once per object while the object lives: every later send of the same object
  passes the same reader's description, and every reader maps the same pages.
- A buffer that is all of a received one (an argument or result passed on as it came, as
  a cache does) goes on as the description it came in, without any copy.
- A read-only array made by :func:`shared_array` lives on a segment of its own: it goes as
  that segment, without any copy, and its owner holds no private copy either.

``COURIER_SHARED_MEMORY=0`` (read when courier is imported, on either side) turns this
off: buffers then travel through the socket as before. ``COURIER_SHARED_MEMORY_MIN_BYTES``
sets the threshold, ``COURIER_SHARED_MEMORY_KEEP_BYTES`` how many bytes of idle segments
a sender keeps for reuse besides the one it writes.
"""

from __future__ import annotations

import array
import errno
import fcntl
import mmap
import operator
import os
import socket
import struct
import threading
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    import numpy

_SUPPORTED = (hasattr(os, 'memfd_create') and hasattr(fcntl, 'F_ADD_SEALS')
              and hasattr(fcntl, 'F_OFD_SETLK') and os.path.isdir('/proc/self/fd'))  # Linux.
# Whether this process offers and accepts shared memory on Unix sockets.
ENABLED = _SUPPORTED and os.environ.get('COURIER_SHARED_MEMORY', '1').strip().lower() not in (
    '0', 'false', 'off', 'no')
# Buffers from this size on travel through shared memory; smaller ones through the socket.
MIN_BYTES = max(1, int(os.environ.get('COURIER_SHARED_MEMORY_MIN_BYTES', 1 << 20)))
# Bytes of idle segments (no reader left) a sender keeps for reuse besides the one it writes.
KEEP_BYTES = max(0, int(os.environ.get('COURIER_SHARED_MEMORY_KEEP_BYTES', 256 << 20)))
# A buffer size in a frame's table with this bit set travels as the next received descriptor.
SHARED_BIT = 1 << 63
# The most descriptors one message carries (the kernel's SCM_MAX_FD): later buffers of a
# frame with more travel through the socket.
MAX_DESCRIPTORS = 253
ANCILLARY_SPACE = socket.CMSG_SPACE(MAX_DESCRIPTORS * 4)

# A segment's size is fixed: a mapping of it can never lose its pages (SIGBUS).
_SEALS = (fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW) if _SUPPORTED else 0
_GRAIN = 1 << 20  # Segment sizes are multiples of this.
_KEPT_AT = 1 << 62  # The byte its sender's lock marks a segment kept (readers lock below it).
_FLOCK = struct.Struct('hhqqi4x')  # struct flock: type, whence, start, length, pid.
_MAX_IDLE_MAPPINGS = 64  # Mappings a receiver keeps with no array on them, at most.
_THP = '/sys/kernel/mm/transparent_hugepage'


class Memfd:
    """An open file descriptor, closed once nothing refers to it (or at :meth:`close`)."""

    __slots__ = ('fd', '__weakref__')

    def __init__(self, fd: int):
        self.fd = fd

    def close(self, _close=os.close) -> None:  # os may be gone when the interpreter exits.
        fd, self.fd = self.fd, -1
        if fd >= 0:
            _close(fd)

    def __del__(self):
        self.close()


class Descriptors:
    """The first part of a frame whose buffers travel in shared memory: the files to pass
    along with its first bytes (:func:`courier.transport.frames.send`)."""

    __slots__ = ('files', 'ancillary')

    def __init__(self, files: List[Memfd]):
        self.files = files  # Holds them open until the frame is sent or dropped.
        self.ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                           array.array('i', [file.fd for file in files]).tobytes())]


def share(buffers: Sequence[Any]) -> Tuple[List[Any], Optional[Descriptors]]:
    """Returns the frame's buffers with those of :data:`MIN_BYTES` or more replaced by the
    size (with :data:`SHARED_BIT`) of the shared memory holding them, and the files to pass
    (None when every buffer goes through the socket)."""
    shared: List[Any] = []
    files: List[Memfd] = []
    for buffer in buffers:
        view = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
        if view.nbytes < MIN_BYTES or len(files) >= MAX_DESCRIPTORS:
            shared.append(buffer)
            continue
        try:
            files.append(_reader_holding(view))
        except OSError:  # Out of memory or descriptors for a segment: through the socket.
            shared.append(buffer)
            continue
        shared.append(view.nbytes | SHARED_BIT)
    if not files:
        return list(buffers), None
    return shared, Descriptors(files)


def take_descriptors(ancillary: List[tuple], into: List[int]) -> None:
    """Appends the descriptors that ``recvmsg`` passed in ``ancillary`` to ``into``."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            descriptors = array.array('i')
            descriptors.frombytes(data[:len(data) - len(data) % descriptors.itemsize])
            into.extend(descriptors)


def receive(fd: int, size: int) -> memoryview:
    """Maps ``size`` bytes of the received segment ``fd`` read-only (taking ``fd`` over).

    The buffer holds ``fd`` (and so its read lock) while anything made from it lives.

    Raises:
      ValueError: ``fd`` is not a memfd of at least ``size`` bytes sealed against resizing,
        as courier's sender makes them (it could shrink under the mapping).
    """
    file = Memfd(fd)
    if size <= 0:
        raise ValueError('the peer passed shared memory for an empty buffer')
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        status = os.fstat(fd)
    except OSError as error:
        raise ValueError(f'the peer passed a descriptor that is not a memfd ({error})') from None
    if seals & _SEALS != _SEALS or status.st_size < size:
        raise ValueError(f'the peer passed shared memory that is not sealed or too small '
                         f'({status.st_size} bytes for a buffer of {size}, seals {seals:#x})')
    import numpy  # pylint: disable=import-outside-toplevel  (a dependency; only needed here)
    mapping = _mappings.get(file, (status.st_dev, status.st_ino), status.st_size)
    if mapping is None:  # Out of mappings (vm.max_map_count): a private copy instead.
        copy = bytearray(size)
        view = memoryview(copy)
        done = 0
        while done < size:
            done += os.preadv(fd, [view[done:]], done)
        return view.toreadonly()
    # The buffer's owner: every view or array made from it keeps it, so its death says
    # that the reader let go (a memoryview would not: views of it skip it).
    owner = numpy.frombuffer(mapping, numpy.uint8, size)
    _mappings.lend(owner, file, (status.st_dev, status.st_ino))
    return memoryview(owner)


class _Mapped:
    """A receiver's read-only mapping of a whole segment, and which of its buffers use it."""

    __slots__ = ('mapping', 'file', 'owners', 'huge')

    def __init__(self, mapping: mmap.mmap, file: Memfd):
        self.mapping = mapping
        self.file = file  # This process's own description: unlocked, asks if the sender keeps it.
        self.owners: set = set()  # ids of the live buffers on it.
        self.huge: Optional[bool] = None  # Whether its pages are mapped as huge pages.

    def let_go(self) -> None:
        """Drops this process's page tables of the idle mapping if its pages are huge ones
        (mapped again at a fault per 2 MiB); the pages stay while the sender keeps them."""
        if self.huge is None:
            self.huge = _pmd_mapped(self.mapping)
        if self.huge:
            try:
                self.mapping.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # Nothing lost: the pages stay mapped.
                pass


class _Mappings:
    """A receiver's mappings of segments, by inode, and its live buffers on them."""

    def __init__(self):
        self.lock = threading.Lock()
        self._mapped: Dict[tuple, _Mapped] = {}  # Oldest use first.
        self._owners: Dict[int, Tuple[weakref.ref, Memfd, tuple]] = {}

    def get(self, file: Memfd, key: tuple, length: int) -> Optional[mmap.mmap]:
        """The mapping of the segment ``file`` (made now, or kept from before); None if no
        mapping can be made."""
        with self.lock:
            mapped = self._mapped.pop(key, None)
            if mapped is None:
                try:
                    own = Memfd(os.open(f'/proc/self/fd/{file.fd}', os.O_RDONLY | os.O_CLOEXEC))
                    mapped = _Mapped(mmap.mmap(own.fd, length, flags=mmap.MAP_SHARED,
                                               prot=mmap.PROT_READ), own)
                except OSError:  # Out of descriptors or mappings.
                    return None
            self._mapped[key] = mapped
            self._sweep()
            return mapped.mapping

    def lend(self, owner: Any, file: Memfd, key: tuple) -> None:
        """Keeps the received description ``file`` open while the buffer ``owner`` lives."""
        ident = id(owner)
        self._owners[ident] = (weakref.ref(owner, lambda _: self._released(ident, key)), file,
                               key)
        mapped = self._mapped.get(key)
        if mapped is not None:
            mapped.owners.add(ident)

    def file_of(self, obj: Any, size: int) -> Optional[Memfd]:
        """The received description of the buffer ``obj`` (followed through views), if ``obj``
        is all of one."""
        for _ in range(32):
            entry = self._owners.get(id(obj))
            if entry is not None and entry[0]() is obj:
                return entry[1] if obj.nbytes == size else None
            if isinstance(obj, memoryview):
                obj = obj.obj
            elif type(obj).__module__ == 'numpy' and getattr(obj, 'base', None) is not None:
                obj = obj.base
            else:
                return None
        return None

    def _released(self, ident: int, key: tuple) -> None:
        # Runs wherever the last array went (any thread, maybe inside get): no waiting here.
        self._owners.pop(ident, None)  # Its description closes once no frame passes it.
        mapped = self._mapped.get(key)
        if mapped is not None:
            mapped.owners.discard(ident)
        if self.lock.acquire(False):
            try:
                self._sweep()
                mapped = self._mapped.get(key)
                if mapped is not None and not mapped.owners:
                    mapped.let_go()
            finally:
                self.lock.release()

    def _sweep(self) -> None:
        """Drops the idle mappings of segments that their sender no longer keeps, and the
        oldest beyond :data:`_MAX_IDLE_MAPPINGS`. (Their pages went with the last array, or
        when the sender dropped the segment.)"""
        idle = [key for key, mapped in self._mapped.items() if not mapped.owners]
        for count, key in enumerate(reversed(idle)):
            if count >= _MAX_IDLE_MAPPINGS or not _locked(self._mapped[key].file.fd, _KEPT_AT, 1):
                del self._mapped[key]

    def reset(self) -> None:
        self.lock = threading.Lock()


def shmem_huge_pages() -> bool:
    """Whether this kernel backs shared memory advised for it with PMD-size huge pages
    (``shmem_enabled``, for the PMD size where the kernel sets sizes apart)."""
    def setting(name: str) -> str:
        try:
            with open(f'{_THP}/{name}') as file:
                text = file.read()
        except OSError:
            return ''
        return text[text.find('[') + 1:text.find(']')] if '[' in text else ''

    try:
        with open(f'{_THP}/hpage_pmd_size') as file:
            pmd = int(file.read()) >> 10
    except (OSError, ValueError):
        return False
    chosen = setting(f'hugepages-{pmd}kB/shmem_enabled')
    if chosen in ('', 'inherit'):
        chosen = setting('shmem_enabled')
    return chosen in ('always', 'within_size', 'advise', 'force')


def _pmd_mapped(mapping: mmap.mmap) -> Optional[bool]:
    """Whether this process maps most of its resident pages of ``mapping`` as huge pages;
    None while its first page is not mapped (not known yet: a receiver that does not read
    a buffer maps none of it). Asked once per mapping: a sender's pages keep their size."""
    if not shmem_huge_pages():
        return False
    import numpy  # pylint: disable=import-outside-toplevel
    address = numpy.frombuffer(mapping, numpy.uint8, 1).__array_interface__['data'][0]
    try:  # One entry of the page table (/proc/self/smaps costs milliseconds to read).
        pagemap = os.open('/proc/self/pagemap', os.O_RDONLY | os.O_CLOEXEC)
        try:
            entry = os.pread(pagemap, 8, address // mmap.PAGESIZE * 8)
        finally:
            os.close(pagemap)
        if len(entry) == 8 and not int.from_bytes(entry, 'little') >> 63:  # Not present.
            return None
        sizes: Dict[str, int] = {}
        inside = False
        with open('/proc/self/smaps') as smaps:
            for line in smaps:
                if not line[:1].isupper():  # A mapping's first line: its address range.
                    if inside:
                        break
                    inside = line.startswith(f'{address:08x}-')
                elif inside and line.startswith(('Rss:', 'ShmemPmdMapped:')):
                    name, value = line.split()[:2]
                    sizes[name] = int(value)
    except OSError:
        return False
    resident = sizes.get('Rss:', 0)
    return None if not resident else 2 * sizes.get('ShmemPmdMapped:', 0) >= resident


def _locked(fd: int, start: int, length: int) -> bool:
    """Whether another description holds a lock on these bytes of ``fd``'s file."""
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, 0, start, length, 0))
    return _FLOCK.unpack(answer)[0] != fcntl.F_UNLCK


def _lock(fd: int, kind: int, start: int, length: int) -> bool:
    """Takes (or with F_UNLCK drops) a lock of ``fd``'s description; False if others hold one."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, 0, start, length, 0))
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class _Segment:
    """A memfd a sender writes buffers into, again and again once no reader is left."""

    __slots__ = ('file', 'capacity', 'mapping', 'writing', 'owned')

    def __init__(self, capacity: int):
        self.file = Memfd(os.memfd_create('courier', os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
        self.capacity = capacity
        os.ftruncate(self.file.fd, capacity)
        fcntl.fcntl(self.file.fd, fcntl.F_ADD_SEALS, _SEALS)
        _lock(self.file.fd, fcntl.F_RDLCK, _KEPT_AT, 1)
        # Copies into mapped pages run twice as fast as pwrite's into the file.
        self.mapping = mmap.mmap(self.file.fd, capacity)
        try:  # Huge pages where the kernel gives shared memory some (shmem_enabled).
            self.mapping.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):  # A kernel without transparent huge pages.
            pass
        self.writing = True  # Taken by this process's thread that made it.
        self.owned = False  # True while an array of shared_array() lives on it.

    def claim(self) -> bool:
        """Locks the segment for writing; False while a reader may still read it."""
        return _lock(self.file.fd, fcntl.F_WRLCK, 0, _KEPT_AT)

    def unclaim(self) -> None:
        _lock(self.file.fd, fcntl.F_UNLCK, 0, _KEPT_AT)

    def free(self) -> None:
        """Frees the claimed segment's pages now, also those that receivers' idle mappings
        of it still map (they drop those mappings later), and closes it."""
        try:
            self.mapping.madvise(mmap.MADV_REMOVE)  # A hole over all of it, for every mapper.
        except OSError:  # Not a kernel that can: the pages go once receivers unmap it.
            pass
        try:
            self.mapping.close()
        except BufferError:  # A shared_array() going away this moment: it unmaps with it.
            pass
        self.file.close()

    def reader(self) -> Memfd:
        """A new reader's description of the (unclaimed) segment, holding a read lock."""
        reader = Memfd(os.open(f'/proc/self/fd/{self.file.fd}', os.O_RDONLY | os.O_CLOEXEC))
        if not _lock(reader.fd, fcntl.F_RDLCK, 0, _KEPT_AT):
            raise OSError(errno.EAGAIN, 'a segment being written was locked by another')
        return reader

    def write(self, view: memoryview) -> Memfd:
        """Writes ``view`` at the start of the claimed segment; returns a reader's
        description, locked: the segment stays unwritten while a holder of it lives."""
        data = view.cast('B') if view.format != 'B' or view.ndim != 1 else view
        try:
            self.claim()  # Ours already (see _Pool.take): held while writing.
            import numpy  # pylint: disable=import-outside-toplevel
            # numpy copies without the GIL: the server's other threads go on meanwhile.
            numpy.copyto(numpy.frombuffer(self.mapping, numpy.uint8, data.nbytes),
                         numpy.frombuffer(data, numpy.uint8))
            self.unclaim()
            return self.reader()
        finally:
            self.writing = False


class _Pool:
    """A sender's segments: reused once no reader holds them, the idle ones kept up to
    :data:`KEEP_BYTES` (the least recently used go first)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._segments: List[_Segment] = []  # Least recently used first.

    def take(self, size: int, owned: bool = False) -> _Segment:
        """A segment of at least ``size`` bytes for this thread to write, claimed; or with
        ``owned``, unclaimed and kept from reuse until :meth:`disown`."""
        capacity = -(-size // _GRAIN) * _GRAIN
        chosen = None
        kept = 0
        dropped = []
        with self._lock:
            for segment in reversed(self._segments):
                if segment.writing or segment.owned or not segment.claim():
                    continue  # Another thread writes it, or readers hold it.
                if chosen is None and capacity <= segment.capacity <= capacity + capacity // 4:
                    chosen = segment
                    continue
                kept += segment.capacity
                if kept > KEEP_BYTES:
                    dropped.append(segment)  # Claimed: it goes now, pages and all.
                else:
                    segment.unclaim()
            if chosen is None:
                chosen = _Segment(capacity)
            self._segments = [segment for segment in self._segments
                              if segment is not chosen and segment not in dropped]
            chosen.writing = not owned
            chosen.owned = owned
            if owned:
                chosen.unclaim()
            self._segments.append(chosen)
        for segment in dropped:
            segment.free()
        return chosen

    def disown(self, segment: _Segment) -> None:
        """The array of :func:`shared_array` on ``segment`` is gone: reuse it once readers
        let go."""
        with self._lock:
            segment.owned = False

    def reset(self) -> None:
        # A forked child writes into segments of its own, never its parent's.
        self._lock = threading.Lock()
        self._segments = []


class _Placed:
    """The reader's descriptions of read-only buffers sent before, by exporting object, while
    it lives."""

    def __init__(self):
        self._lock = threading.Lock()
        self.writing = threading.Lock()  # Held while a buffer is looked up and placed.
        self._files: Dict[int, Tuple[weakref.ref, int, Memfd]] = {}

    def get(self, owner: Any, size: int) -> Optional[Memfd]:
        entry = self._files.get(id(owner))
        if entry is None or entry[0]() is not owner or entry[1] != size:
            return None
        return entry[2]

    def put(self, owner: Any, size: int, file: Memfd) -> None:
        key = id(owner)
        try:
            reference = weakref.ref(owner, lambda _, key=key: self._forget(key))
        except TypeError:  # Not weakly referable (bytes): it cannot be told apart later.
            return
        with self._lock:
            self._files[key] = (reference, size, file)

    def _forget(self, key: int) -> None:
        with self._lock:
            entry = self._files.get(key)
            if entry is not None and entry[0]() is None:
                del self._files[key]  # Its segment is free once readers let go too.

    def reset(self) -> None:
        self._lock = threading.Lock()
        self.writing = threading.Lock()


_mappings = _Mappings()
_pool = _Pool()
_placed = _Placed()
_owned: Dict[int, Tuple[weakref.ref, _Segment]] = {}  # By id: arrays of shared_array().


def shared_array(shape: Union[int, Sequence[int]], dtype: Any = float) -> 'numpy.ndarray':
    """A new numpy array (contents undefined, as ``numpy.empty``'s) in this process's
    shared memory, from which it is sent without a copy once it is read-only.

    Write the value into it, then ``array.setflags(write=False)``: every later send of it
    (or of a read-only view starting where it starts) to a process of this host passes its
    own pages, so a learner whose parameters live in such an array holds one copy of them,
    shared with every caller. While it is writable it is copied at each send like any
    array. Its memory is reused for a later array once it is gone and no reader holds
    it. Where shared memory is off or the array is small, this is ``numpy.empty``.
    """
    import numpy  # pylint: disable=import-outside-toplevel
    dtype = numpy.dtype(dtype)
    if dtype.hasobject:
        raise TypeError(f'courier.shared_array holds plain values, not Python objects (dtype '
                        f'{dtype}): use a numeric or other fixed-size dtype')
    try:
        lengths = (operator.index(shape),)
    except TypeError:
        lengths = tuple(shape)
    count = 1
    for length in lengths:
        count *= operator.index(length)
    if not ENABLED or count * dtype.itemsize < MIN_BYTES or min(lengths, default=0) < 0:
        return numpy.empty(shape, dtype)  # Also raises for a negative length.
    segment = _pool.take(count * dtype.itemsize, owned=True)
    # Every view of it has this flat array as its base (numpy collapses chains of views),
    # so the segment stays owned while any of them lives.
    flat = numpy.frombuffer(segment.mapping, dtype, count)
    key = id(flat)

    def gone(_, key=key, segment=segment):
        _owned.pop(key, None)
        _pool.disown(segment)

    _owned[key] = (weakref.ref(flat, gone), segment)
    return flat.reshape(shape)


def _owned_segment(view: memoryview) -> Optional[_Segment]:
    """The segment of :func:`shared_array` that ``view`` starts at the start of, if any."""
    obj = view.obj
    for _ in range(32):
        entry = _owned.get(id(obj))
        if entry is not None and entry[0]() is obj:
            import numpy  # pylint: disable=import-outside-toplevel
            start = numpy.frombuffer(view, numpy.uint8).__array_interface__['data'][0]
            return entry[1] if start == obj.__array_interface__['data'][0] else None
        obj = getattr(obj, 'base', None)
        if obj is None:
            return None
    return None


def _reader_holding(view: memoryview) -> Memfd:
    """A reader's description of a segment holding ``view``'s bytes: the one it was
    received in or placed in before (or that it lives in), else one just written."""
    file = _mappings.file_of(view.obj, view.nbytes)
    if file is not None:
        return file
    if not view.readonly:
        return _pool.take(view.nbytes).write(view)
    exporter = view.obj
    with _placed.writing:  # Many callers of one new value at once: one writes, all share.
        file = _placed.get(exporter, view.nbytes)
        if file is None:
            segment = _owned_segment(view)
            file = (_pool.take(view.nbytes).write(view) if segment is None
                    else segment.reader())
            _placed.put(exporter, view.nbytes, file)
    return file


def _reset_after_fork() -> None:
    # A child inherits no threads holding the locks, and keeps the parent's mappings.
    _mappings.reset()
    _pool.reset()
    _placed.reset()
    _owned.clear()


os.register_at_fork(after_in_child=_reset_after_fork)
