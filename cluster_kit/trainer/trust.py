"""What clusterkit trusts on disk: a real folder or file of this user that nobody else can write.

Records, scripts and compiled code that a job reads back often live where other
users may create entries first (a shared log folder, ``/tmp``). One that is a
symbolic link, not this user's, or writable by group or others could hold what
someone else put there. :func:`problem` says which; its callers decide what to do
(the supervisor stops the job, ``ddp`` compiles elsewhere). Stdlib only,
Python 3.8+: it travels in the supervisor's bundle and beside ``ddp.py``.
"""

from __future__ import annotations

import os
import pwd
import stat


def problem(st: os.stat_result, kind: str) -> str | None:
    """Why ``st`` (an lstat/fstat) is not a ``kind`` ("folder" or "file") of this user that
    group and others cannot write ("is a symbolic link", ...); None when it is one."""
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "folder" else stat.S_ISREG(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not is_kind:
        return f"is not a {kind}"
    if st.st_uid != os.getuid():
        return f"belongs to {user_name(st.st_uid)}, not to the job's user ({user_name(os.getuid())})"
    writers = st.st_mode & 0o022
    if writers:
        who = "group and others" if writers == 0o022 else "group" if writers == 0o020 else "others"
        return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def user_name(uid: int) -> str:
    """``alice (uid 1001)``, or the bare uid where no account has it."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
