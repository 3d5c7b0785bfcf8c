"""The seccomp filter of every process that runs student code: the probe's supervisor and
workers (``probe_harness.py``) and the notebook's kernel (``kernel_launcher.py``).

Both get the same filter, so code cannot tell a grading run from the notebook's run by reading
``/proc/self/status`` or by trying what it denies. Once installed it holds for the process and
everything it forks later; it cannot be removed.
"""
import ctypes
import platform

# x86_64 system calls no process running student code needs, and that could carry data from
# one probe worker to the next or escape the harness: exec (a fresh interpreter has no audit
# hook), System V IPC, POSIX message queues, keyrings, io_uring, ptrace and other processes'
# memory, namespaces.
DENIED_SYSCALLS_X86_64 = (
    59, 322,                                    # execve, execveat
    29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71,  # shm*, sem*, msg*
    240, 241, 242, 243, 244, 245,               # mq_*
    248, 249, 250,                              # add_key, request_key, keyctl
    425, 426, 427,                              # io_uring_*
    101, 310, 311, 438, 323, 321, 298,          # ptrace, process_vm_*, pidfd_getfd, userfaultfd, bpf, perf
    272, 308, 165, 155, 161, 303, 304,          # unshare, setns, mount, pivot_root, chroot, *_handle_at
)


def install():
    """Deny DENIED_SYSCALLS_X86_64 (EPERM) here and in every process forked later. Returns
    whether the filter is in place (only x86_64 is supported). It applies to the calling
    thread only: call it before the process starts any thread."""
    if platform.machine() != "x86_64":
        return False
    denied = len(DENIED_SYSCALLS_X86_64)
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1   # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    program = [(ld_abs, 0, 0, 4), (jeq, 1, 0, 0xC000003E), (ret, 0, 0, deny),  # arch is x86_64
               (ld_abs, 0, 0, 0), (jge, denied + 1, 0, 0x40000000)]  # no x32
    for index, number in enumerate(DENIED_SYSCALLS_X86_64):
        program.append((jeq, denied - index, 0, number))
    program += [(ret, 0, 0, allow), (ret, 0, 0, deny)]

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*program)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:   # PR_SET_NO_NEW_PRIVS
        return False
    return libc.prctl(22, 2, ctypes.byref(Program(len(program), filters)), 0, 0) == 0  # SECCOMP_MODE_FILTER
