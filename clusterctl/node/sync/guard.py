"""Where a sync may write: DST resolved on the node (realpath, every symlink followed) and judged before
anything in it is touched: never a system folder, the login home, clusterctl's own folders, nor SRC, a
folder that holds SRC or one inside it (SRC as resolved where it is: device, inode and boot id)."""

from __future__ import annotations

import os

from clusterctl.node.sync.manifest import AgentError, Args


def resolve_root(dst: str) -> str:
    root = os.path.abspath(os.path.expanduser(dst)) if not dst.startswith("/") else os.path.normpath(dst)
    if root == "/":
        raise AgentError("refusing to sync into /", 2)
    return root


# Never written into (nor anything inside them), whatever the flags: the system's own trees.
SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/snap",
    "/sys",
    "/usr",
    "/var",
)


# clusterctl's own folders on a node: the node runtimes (runtime/spec.py ROOT) and the AWS idle watchdog
# (autostop/watchdog.py), and the login home's .clusterctl (every run's work folder, this script among
# them). Never synced into, nor held by a DST with --delete. The one exception: the runtime's own relay
# lands its pack in RUNTIME_INCOMING/<id> (runtime/install.py INCOMING).
TOOL_TREES = ("/opt/clusterctl-runtime", "/opt/clusterctl")
RUNTIME_INCOMING = "/opt/clusterctl-runtime/.incoming"
TOOL_HOME = ".clusterctl"


def _within(path: str, tree: str) -> bool:
    """path is tree or lies inside it (both absolute and normalized)."""
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def dst_problem(real: str, home: str, delete: bool) -> str | None:
    """Why DST (already realpath'd, symlinks followed) must not be synced into, or None. The same rules
    as `clean --logs` (clean.logs_command): with --delete, or for a removal, `delete` is True."""
    if real == "/":
        return "it resolves to /"
    for tree in SYSTEM_TREES:
        if _within(real, tree):
            return f"{real} is a system folder ({tree})"
    if real == home or home.startswith(real.rstrip("/") + "/"):
        return f"{real} is the login home {home} or holds it"
    for tree in (*TOOL_TREES, os.path.join(home, TOOL_HOME)):
        if _within(real, tree) and not real.startswith(RUNTIME_INCOMING + "/"):
            return f"{real} is in clusterctl's own folder {tree}"
        if delete and tree.startswith(real + "/"):
            return f"{real} holds clusterctl's own folder {tree} (--delete would empty it)"
    if delete:
        if real.count("/") == 1:
            return f"{real} is a top-level folder (--delete would empty it)"
        for dirpath, dirnames, filenames in os.walk(real, followlinks=False):
            if ".ssh" in dirnames or ".ssh" in filenames or os.path.basename(dirpath) == ".ssh":
                return f"{real} holds an .ssh folder ({dirpath}): --delete could lock users out"
    return None


def boot_id() -> str:
    """This kernel's boot id ("" where there is none). Two views of a folder with one boot id are one
    kernel's (namespace nodes and this machine; a hosts file naming this machine), where a device and inode
    name one folder; another machine's boot id differs, so no folder there is taken for the source."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def folder_id(path: str) -> str:
    """device:inode of the folder at path (symlinks followed)."""
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def source_relation(real: str, src: str, src_id: str, src_boot: str) -> tuple[str, str]:
    """How DST, resolved on this node (real), stands to SRC: the source folder resolved where it is (src),
    its device:inode and its kernel's boot id. ("", "") when this node cannot see SRC (another kernel, or
    another folder at that path, as a namespace node's own /root); else "is" (DST is SRC), "holds" or
    "inside", and SRC's path as seen here. Also found when SRC is seen under another path (a bind mount):
    DST or a folder above it being SRC."""
    if not src or not src_boot or src_boot != boot_id():
        return "", ""
    try:
        here = os.path.realpath(src)
        seen = folder_id(here) == src_id
    except OSError:
        seen = False
    if seen:
        if real == here:
            return "is", here
        if _within(here, real):
            return "holds", here
        if _within(real, here):
            return "inside", here
    p = real
    while True:
        try:
            if folder_id(p) == src_id:
                return ("is" if p == real else "inside"), p
        except OSError:
            pass  # not made yet
        if p == "/":
            return "", ""
        p = os.path.dirname(p)


def safe_root(args: Args) -> tuple[str, bool]:
    """DST resolved on this node (symlinks followed) and whether it is SRC itself (--src ...), refused (exit 2)
    before anything in it is touched: a system or clusterctl folder (dst_problem), or SRC, a folder holding
    SRC or one inside it (the copy would write into its own source, and --delete remove it). DST being SRC
    is allowed with --src-may-be-dst (a leader source: that node's copy is the source, checked; no data is
    written into it or deleted from it, only its state folder kept)."""
    dst, delete = args["dst"], bool(args.get("delete"))
    home = os.path.realpath(os.path.expanduser("~"))
    real = os.path.realpath(resolve_root(dst))
    problem = dst_problem(real, home, delete)
    hint = "name a folder of its own (not a system folder, the home, nor clusterctl's)"
    relation, here = source_relation(real, args.get("src", ""), args.get("src_id", ""), args.get("src_boot", ""))
    said = {
        "holds": f"it resolves to {real}, which holds SRC {here}",
        "inside": f"it resolves to {real}, inside SRC {here}",
        "is": "" if args.get("src_may_be_dst") else f"it resolves to {real}, which is SRC {here} itself",
    }.get(relation, "")
    if said:
        problem, hint = said, "sync into a folder outside SRC that does not hold it (e.g. one beside it)"
    if problem:
        raise AgentError(f"refusing to sync into {dst}: {problem}", 2, hint)
    return real, relation == "is"
