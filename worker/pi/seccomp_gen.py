#!/usr/bin/env python3
# worker/pi/seccomp_gen.py: writes the seccomp allow-lists of the rich (Pi)
# image, worker/pi/seccomp.json, and of the precheck image,
# worker/precheck/seccomp.json (shared/spec/hardening.md 1, issue 21 item 3),
# from the one commented list below. Run it after editing the list:
#
#   python3 worker/pi/seccomp_gen.py           (rewrites both files)
#   python3 worker/pi/seccomp_gen.py --check   (exits 1 if a file differs)
#
# How the list was measured (docs/threat-model.md has the figures):
#   rich      strace -f -s 256 over `bun test spec/rich_worker/` (56 cases:
#             the worker, pi-main.js on the npm bun, and every Claude Code
#             process it starts, node_modules/@anthropic-ai/claude-agent-sdk-
#             linux-x64/claude), attributed per program
#             (calls of the test runner, git, grep, ps, sh and unshare left
#             out: none is in the image); then the rich Docker specs
#             (spec/docker/rich_worker.test.mjs, rich_runtime_spec.lua) under
#             the profile.
#   precheck  strace -f over spec/precheck_entry_spec.lua (the entry script on
#             the npm bun, 13 cases with MCP calls through the real broker),
#             then spec/docker/precheck_spec.lua under the profile.
#   both      runc init's calls between loading the filter and exec'ing the
#             entrypoint (the sealed profile's measurement, worker/seccomp.json);
#             bun's pwritev2/preadv2/poll on its stdio, which only the container
#             runs showed (a logging copy: defaultAction SCMP_ACT_LOG, kernel
#             audit type=1326 lines, lossy without auditd; then the profile
#             itself); clock_gettime, which gVisor serves as a system call.
# Measured but refused: inotify_init1/add_watch/rm_watch (Claude Code's file
# watcher: it runs on without it; a turn needs no file watching), keyctl
# (pi-mcp-adapter's OAuth keyring lookup: rich mode's MCP goes through the
# broker, never OAuth in the container), mount/unshare (only the host spec's
# wrapper). clone3 answers ENOSYS, not EPERM, so glibc's pthread_create falls
# back to clone, whose flags the filter can read (no CLONE_NEW*).
import json
import os
import sys

R, P = "rich", "precheck"
BOTH = (R, P)

# (names, profiles, comment): unconditional allows.
ALLOW = [
    (["execve"], BOTH,
     "runc's exec of the image ENTRYPOINT (bun) is the first call the filter sees; the rich worker also "
     "execs Claude Code (the Agent SDK's claude binary) for each turn"),
    (["exit", "exit_group", "restart_syscall", "rt_sigreturn"], BOTH,
     "process, thread and signal-handler exit; the kernel's restart of an interrupted call"),
    (["brk", "mmap", "munmap", "mprotect", "madvise"], BOTH,
     "memory: glibc, mimalloc and JavaScriptCore's heap and JIT (bounded by --memory)"),
    (["arch_prctl", "set_tid_address", "set_robust_list", "rseq", "prlimit64", "getrandom",
      "sched_getaffinity", "sysinfo", "uname", "prctl"], BOTH,
     "start-up of bun (dynamic glibc): TLS, robust list, rseq, stack limit, random seed, CPU count, memory size; "
     "prctl: thread names (PR_SET_NAME), PR_SET_VMA, PR_GET/SET_THP_DISABLE, PR_CAPBSET_READ"),
    (["futex", "sched_yield", "sigaltstack", "rt_sigaction", "rt_sigprocmask", "gettid", "getpid", "tgkill"], BOTH,
     "threads and signals: bun's worker threads, JavaScriptCore's GC (signals to its own threads)"),
    (["nanosleep", "clock_nanosleep", "getppid", "epoll_pwait", "fstatfs"], BOTH,
     "runc init's Go runtime between the filter load and its exec (the sealed profile's strace of runc: threads "
     "parked in futex/nanosleep/epoll_pwait, the close-range walk of /proc/self/fd); clock_nanosleep: Claude Code"),
    (["clock_gettime", "gettimeofday", "time"], BOTH,
     "clocks: normally the vDSO (so strace on the host sees them from Claude Code only); under gVisor (runsc) "
     "the call itself, without which bun aborts at start (measured: the one call a bun -e needed there)"),
    (["rt_sigsuspend", "sched_setscheduler", "timerfd_create", "timerfd_settime"], (R,),
     "Claude Code: waiting for signals, lowering its helper threads' priority, its loop's timers"),
    (["getuid", "getgid", "geteuid", "getegid", "getrusage"], (R,),
     "reading its own ids and usage (os.userInfo, process.resourceUsage; Claude Code's start-up)"),
    (["epoll_create1", "epoll_ctl", "epoll_pwait2", "eventfd2"], BOTH,
     "bun's event loop: epoll and its wake-up eventfds"),
    (["read", "write", "pread64", "pwritev", "close", "close_range", "lseek", "fstat", "newfstatat",
      "getdents64", "access", "readlink", "getcwd", "chdir", "fcntl", "ioctl", "ftruncate", "fallocate"], BOTH,
     "descriptor and file I/O: stdin/stdout, the workspace, /tmp, bun's module loader and its transpiler cache "
     "(fallocate + pwritev + renameat); ioctl is TCGETS/TIOCGWINSZ/FIONREAD/FIONBIO on its own descriptors"),
    (["pwrite64", "stat", "statx", "faccessat", "dup2", "fsync", "rmdir", "unlinkat", "rename", "linkat",
      "symlink", "symlinkat", "utimensat", "copy_file_range"], (R,),
     "the rich worker's sessions, outbox, attachments and Claude Code's config and projects (atomic writes: "
     "temp, fsync, rename; lock directories; copy_file_range for copies; dup2 in a child before its exec)"),
    (["pwritev2", "preadv2", "poll"], BOTH,
     "bun's reads of stdin and writes to stdout and files, and its poll of stdin (seen in the container under the "
     "logging profile: SCMP_ACT_LOG, kernel audit type=1326 syscall=328, 327, 7; the host's strace saw pwritev/read)"),
    (["unlink", "renameat"], BOTH,
     "bun's transpiler cache in /tmp (renameat of a temp file, unlink of stale entries); the rich worker's outbox"),
    (["vfork", "wait4", "pidfd_open", "kill"], (R,),
     "the rich worker starts Claude Code (bun's spawn: vfork + execve, pidfd_open, wait4); kill: stopping it on "
     "an abort (bounded by --pids-limit)"),
    (["connect", "sendto", "recvfrom", "setsockopt"], BOTH,
     "sockets: the broker over /run/sandbox/broker.sock (/broker/broker.sock in precheck)"),
    (["bind", "listen", "accept4", "getsockname", "getsockopt", "recvmsg", "sendmmsg", "shutdown", "socketpair"], (R,),
     "the rich worker's loopback forwarder (127.0.0.1:8080) Claude Code connects to; socketpairs to its children"),
]

SOCKET_FAMILIES = [
    (1, "AF_UNIX: the broker socket, socketpairs"),
    (2, "AF_INET: the network namespace is empty (--network none), so only the container's own loopback"),
    (10, "AF_INET6: as AF_INET (no route out); every other family (netlink, packet, alg, vsock, key) is refused"),
]

# Mode bits a mode argument must not carry: no setuid, setgid or world-writable entry.
MODE_MASK = 0o6002
CREATE_MASK = 0o6000
CREATING = ("mkdir", "mkdirat", "creat", "open", "openat")
BITS = [(0o4000, "S_ISUID"), (0o2000, "S_ISGID"), (0o0002, "S_IWOTH")]
O_CREAT, O_TMPFILE = 0o100, 0o20000000
# (call, index of the mode argument, index of the flags argument or None)
MODE_CALLS = [("chmod", 1, None), ("fchmod", 1, None), ("fchmodat", 2, None), ("mkdir", 1, None),
              ("mkdirat", 2, None), ("creat", 1, None), ("open", 2, 1), ("openat", 3, 2)]
CLONE_NEW = [(0x00020000, "CLONE_NEWNS"), (0x02000000, "CLONE_NEWCGROUP"), (0x04000000, "CLONE_NEWUTS"),
             (0x08000000, "CLONE_NEWIPC"), (0x10000000, "CLONE_NEWUSER"), (0x20000000, "CLONE_NEWPID"),
             (0x40000000, "CLONE_NEWNET")]

NEVER = [
    (["inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch"],
     "never: inotify (a guest took all 128 inotify instances of the service account; Claude Code's watcher runs on without it)"),
    (["fanotify_init", "fanotify_mark"], "never: fanotify"),
    (["io_uring_setup", "io_uring_enter", "io_uring_register"], "never: io_uring (bun falls back to its epoll loop)"),
    (["keyctl", "add_key", "request_key"],
     "never: the kernel keyrings (per-uid, shared with the host; pi-mcp-adapter's OAuth lookup gets EPERM)"),
    (["mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"],
     "never: POSIX message queues (per-uid limits)"),
    (["userfaultfd", "perf_event_open", "bpf", "ptrace", "process_vm_readv", "process_vm_writev"],
     "never: userfaultfd, perf events, BPF, ptrace"),
    (["mount", "umount2", "unshare", "setns", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
      "fsconfig", "fsmount", "fspick", "mount_setattr"], "never: mounts and namespaces"),
    (["mknod", "mknodat"], "never: device nodes and FIFOs"),
    (["openat2"], "never: openat2 (its mode is in a struct the filter cannot read)"),
    (["umask"], "never: umask (it stays runc's 022, which clears S_IWOTH from every created file and directory)"),
    (["setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "setfsuid", "setfsgid"],
     "never: changing ids"),
]


def rule(names, action, comment, args=None, errno=None):
    r = {"names": names, "action": action}
    if args:
        r["args"] = args
    if errno is not None:
        r["errnoRet"] = errno
    r["comment"] = comment
    return r


def masked(index, mask, value):
    return {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


def profile(which):
    rules = []
    seen = set()
    for names, profiles, comment in ALLOW:
        if which in profiles:
            names = [n for n in names if n not in seen]
            seen.update(names)
            rules.append(rule(names, "SCMP_ACT_ALLOW", comment))
    for fam, comment in SOCKET_FAMILIES:
        rules.append(rule(["socket"], "SCMP_ACT_ALLOW", "sockets: " + comment,
                          [{"index": 0, "value": fam, "op": "SCMP_CMP_EQ"}]))
    for call, mi, fi in MODE_CALLS:
        # chmod-like calls set the mode as given: none of the three bits. A
        # creating call's mode passes through the umask, which stays runc's
        # 022 (umask is never allowed): bun's default 0666/0777 must pass and
        # never yields a world-writable entry; S_ISUID/S_ISGID would survive
        # the umask, so they are refused.
        creates = call in CREATING
        mask = CREATE_MASK if creates else MODE_MASK
        bits = BITS[:2] if creates else BITS
        what = "S_ISUID, S_ISGID (S_IWOTH is cleared by the fixed umask 022)" if creates else \
            "S_ISUID, S_ISGID, S_IWOTH"
        if fi is None:
            rules.append(rule([call], "SCMP_ACT_ALLOW",
                              f"{call} only with a mode (argument {mi}) carrying none of {what} (mask {mask:#o})",
                              [masked(mi, mask, 0)]))
            for bit, bname in bits:
                rules.append(rule([call], "SCMP_ACT_ERRNO",
                                  f"never: {call} with {bname} in its mode (argument {mi}): no setuid, setgid or world-writable entry",
                                  [masked(mi, bit, bit)], 1))
        else:
            rules.append(rule([call], "SCMP_ACT_ALLOW",
                              f"{call} that creates nothing: neither O_CREAT nor O_TMPFILE in its flags (argument {fi})",
                              [masked(fi, O_CREAT | O_TMPFILE, 0)]))
            rules.append(rule([call], "SCMP_ACT_ALLOW",
                              f"{call} whose mode (argument {mi}) carries none of {what}",
                              [masked(mi, mask, 0)]))
            for flag, fname in ((O_CREAT, "O_CREAT"), (O_TMPFILE, "O_TMPFILE")):
                for bit, bname in bits:
                    rules.append(rule([call], "SCMP_ACT_ERRNO", f"never: {call} with {fname} and {bname} in its mode",
                                      [masked(fi, flag, flag), masked(mi, bit, bit)], 1))
    all_new = sum(b for b, _ in CLONE_NEW)
    rules.append(rule(["clone"], "SCMP_ACT_ALLOW",
                      f"clone (threads: glibc's pthread_create after clone3's ENOSYS; forks) only without any CLONE_NEW* flag "
                      f"(mask {all_new:#x})", [masked(0, all_new, 0)]))
    for bit, bname in CLONE_NEW:
        rules.append(rule(["clone"], "SCMP_ACT_ERRNO", f"never: clone with {bname}", [masked(0, bit, bit)], 1))
    rules.append(rule(["clone3"], "SCMP_ACT_ERRNO",
                      "clone3 hides its flags (CLONE_NEW* included) in a struct the filter cannot read: ENOSYS, so "
                      "glibc's pthread_create and bun fall back to clone (EPERM would fail every new thread)", errno=38))
    for names, comment in NEVER:
        rules.append(rule(names, "SCMP_ACT_ERRNO", comment, errno=1))
    path = "worker/pi/seccomp.json" if which == R else "worker/precheck/seccomp.json"
    image = "the rich (Pi) image, pi-roundtable-sandbox:pi" if which == R else \
        "the precheck image, pi-roundtable-sandbox:precheck"
    return {
        "comment": [
            f"{path}: the seccomp profile of {image} (shared/spec/hardening.md 1, issue 21 item 3).",
            "GENERATED by worker/pi/seccomp_gen.py from its commented list: edit that, then run it.",
            "An allow-list: every call allowed below was measured (strace -f of bun running the same entry point",
            "over the specs' real turns, and runc init's calls after it loads the filter; the generator says how);",
            "everything else fails with EPERM (defaultErrnoRet 1). The never entries restate what the allow-list",
            "refuses, one rule per forbidden call or mode bit, so nothing reaches a per-user kernel object shared",
            "with the host (inotify, fanotify, io_uring, keyrings, message queues, userfaultfd, perf, bpf).",
            "Read once at startup (seccomp profile missing: <path>, never a fallback to Docker's default);",
            "passed as --security-opt seccomp=<path> (Engine API: SecurityOpt seccomp=<this JSON>).",
        ],
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "archMap": [
            {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": []},
            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": []},
        ],
        "syscalls": rules,
    }


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    check = "--check" in sys.argv[1:]
    bad = 0
    for which, rel in ((R, "worker/pi/seccomp.json"), (P, "worker/precheck/seccomp.json")):
        text = json.dumps(profile(which), indent=1) + "\n"
        path = os.path.join(root, rel)
        if check:
            try:
                with open(path) as f:
                    same = f.read() == text
            except OSError:
                same = False
            if not same:
                print(f"{rel} is not what worker/pi/seccomp_gen.py writes", file=sys.stderr)
                bad = 1
        else:
            with open(path, "w") as f:
                f.write(text)
    sys.exit(bad)


if __name__ == "__main__":
    main()
