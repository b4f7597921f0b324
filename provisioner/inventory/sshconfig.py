"""ssh_config as OpenSSH reads it: `ssh -G` where `ssh` is installed, paramiko's reader otherwise.

`ssh -G` prints the configuration the user's own `ssh` command would use for a host
(Include, Match, tokens, first match wins) and connects nowhere. Without an `ssh`
binary, paramiko's SSHConfig is the fallback; it refuses what it cannot read exactly
(Include, Match) instead of guessing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pwd
import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from provisioner.errors import InventoryError

# ssh(1) flags an inventory may pass (Ansible's ssh_args / ssh_common_args / ssh_extra_args):
# those taking a value, and those without. Anything else (-E, -L, -R, -D, -W, -S, ...)
# changes what ssh does beyond choosing the endpoint and is refused.
FLAGS_WITH_VALUE = frozenset("oJplicFm")
FLAGS_ALONE = frozenset("46CqvTtAaxXYkKgnN")
# ssh -G keys provisioner reads; the others do not change where or as whom it connects
# (StrictHostKeyChecking, ControlMaster, ...): host keys are always checked strictly.
_REFUSED = {
    "hostkeyalias": "HostKeyAlias",
    "proxyusefdpass": "ProxyUseFdpass",
}
# OpenSSH 9.2's default identity files, used only where no `ssh` can be asked (the fallback);
# with an OpenSSH client the defaults are whatever its `ssh -G` lists for an empty config.
_DEFAULT_KEYS = (
    "~/.ssh/id_rsa",
    "~/.ssh/id_ecdsa",
    "~/.ssh/id_ecdsa_sk",
    "~/.ssh/id_ed25519",
    "~/.ssh/id_ed25519_sk",
    "~/.ssh/id_xmss",
    "~/.ssh/id_dsa",
)
# IdentityFile's expansions, in one pass as OpenSSH makes them: ${VAR} and %x
_EXPANSION = re.compile(r"\$\{(?P<var>[^}]*)(?P<closed>\}?)|%(?P<token>.?)", re.DOTALL)
IDENTITY_TOKENS = "%CLdhiklnpru"  # what ssh_config(5) TOKENS lets IdentityFile use
_CONFIG_ERROR = re.compile(r"^(?P<path>.+?) line (?P<line>\d+): (?P<message>.+)$", re.MULTILINE)
OPENSSH_INSTALL = "apt-get install -y openssh-client (or your system's OpenSSH client package)"


@dataclass(frozen=True)
class Resolved:
    """What ssh would use for one host: after HostName, User, Port, IdentityFile, proxies."""

    hostname: str
    user: str
    port: int
    identity_files: tuple[str, ...] = ()  # as ssh -G lists them (tokens not expanded)
    proxy_jump: str | None = None
    proxy_command: str | None = None
    known_hosts: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()  # options set that provisioner cannot honour


def check_ssh_args(args: Sequence[str]) -> str | None:
    """None when every ssh flag in `args` is one provisioner honours, else the first that is not."""
    items = iter(args)
    for arg in items:
        if not arg.startswith("-") or len(arg) < 2:
            return arg
        for i, flag in enumerate(arg[1:], start=1):
            if flag in FLAGS_WITH_VALUE:
                if i == len(arg) - 1 and next(items, None) is None:
                    return arg
                break
            if flag not in FLAGS_ALONE:
                return arg
    return None


def parse_ssh_g(text: str) -> dict[str, list[str]]:
    """`ssh -G` output: one `key value` per line; repeated keys (identityfile) keep order."""
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key:
            values.setdefault(key.lower(), []).append(value)
    return values


def _one(values: dict[str, list[str]], key: str) -> str | None:
    found = values.get(key)
    return found[0] if found and found[0].lower() != "none" else None


def from_ssh_g(values: dict[str, list[str]]) -> Resolved:
    """The settings provisioner uses, from parsed `ssh -G` output."""
    refused = tuple(name for key, name in _REFUSED.items() if _set(values, key))
    return Resolved(
        hostname=values.get("hostname", [""])[0],
        user=values.get("user", [""])[0],
        port=int(values.get("port", ["22"])[0]),
        identity_files=tuple(values.get("identityfile", [])),
        proxy_jump=_one(values, "proxyjump"),
        proxy_command=_one(values, "proxycommand"),
        known_hosts=tuple(" ".join(values.get("userknownhostsfile", [])).split()),
        refused=refused,
    )


def _set(values: dict[str, list[str]], key: str) -> bool:
    value = _one(values, key)
    return value is not None and value.lower() not in ("no", "false")


def login_home() -> Path:
    """The home OpenSSH expands ~ with: the account's, not $HOME."""
    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        return Path.home()


def homes(home: Path) -> tuple[Path, ...]:
    return (login_home(), home)


@functools.cache
def openssh_default_keys() -> tuple[str, ...]:
    """The identity files this machine's OpenSSH tries when nothing names one, as written
    (~/.ssh/id_...): what `ssh -G` lists for an empty config, whatever its version (9.2 lists
    id_dsa, later ones do not). Without an OpenSSH client, OpenSSH 9.2's list."""
    if not have_openssh():
        return _DEFAULT_KEYS
    try:
        done = subprocess.run(
            ssh_g_command("provisioner-defaults.invalid", (), Path(os.devnull)),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return _DEFAULT_KEYS
    listed = tuple(parse_ssh_g(done.stdout).get("identityfile", ()))
    return listed if done.returncode == 0 and listed else _DEFAULT_KEYS


def names_defaults(files: Sequence[str], defaults: Sequence[str]) -> bool:
    """True when `files` (as `ssh -G` lists them) are OpenSSH's defaults: nothing named
    (OpenSSH adds its defaults only then), or exactly its default list, which it tries the
    same way."""
    return not files or tuple(files) == tuple(defaults)


def expand_tilde(value: str) -> str:
    """~ and ~user as OpenSSH expands them: with the account's home (not $HOME)."""
    if not value.startswith("~"):
        return value
    name, _, rest = value[1:].partition("/")
    if name:
        try:
            home = pwd.getpwnam(name).pw_dir
        except KeyError:
            raise InventoryError(
                f"IdentityFile {value}: no such user {name!r}", "fix the path"
            ) from None
    else:
        home = str(login_home())
    return home.rstrip("/") + "/" + rest.lstrip("/")


def identity_tokens(resolved: Resolved, alias: str) -> dict[str, str]:
    """The values of IdentityFile's % tokens for one connection (ssh_config(5) TOKENS). %C is
    OpenSSH's connection hash, the SHA-1 in hex of %l%h%p%r; %k is HostKeyAlias (refused by
    provisioner) or else %n, the host as given."""
    long_name = socket.gethostname()
    port = str(resolved.port)
    try:
        account = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        account = os.environ.get("USER", "")
    connection = long_name + resolved.hostname + port + resolved.user
    return {
        "%": "%",
        "C": hashlib.sha1(connection.encode()).hexdigest(),
        "L": long_name.split(".")[0],
        "d": str(login_home()),
        "h": resolved.hostname,
        "i": str(os.getuid()),
        "k": alias,
        "l": long_name,
        "n": alias,
        "p": port,
        "r": resolved.user,
        "u": account,
    }


def expand_identity(value: str, resolved: Resolved, alias: str) -> str:
    """One IdentityFile as OpenSSH opens it: ~ first, then ${VAR} and % tokens in one pass
    (what they give is not expanded again). A token IdentityFile does not take, or a
    variable that is not set, is an error, as in OpenSSH."""
    values = identity_tokens(resolved, alias)

    def one(match: re.Match[str]) -> str:
        var, token = match.group("var"), match.group("token")
        if token is None:
            if not match.group("closed") or not var or var not in os.environ:
                raise InventoryError(
                    f"IdentityFile {value}: ${{{var}}} is not a set environment variable",
                    "set it, or write the path without it",
                )
            return os.environ[var]
        if token not in values:
            raise InventoryError(
                f"IdentityFile {value}: %{token} is not a token IdentityFile takes",
                f"use one of {', '.join('%' + t for t in IDENTITY_TOKENS)}"
                " (ssh_config(5) TOKENS), or %% for a literal %",
            )
        return values[token]

    return _EXPANSION.sub(one, expand_tilde(value))


def identity_paths(resolved: Resolved, alias: str) -> list[Path]:
    """Every identity file the configuration names for `alias`, expanded as OpenSSH expands
    it, in its order ("none" entries dropped, as OpenSSH drops them), or OpenSSH's default
    keys when none is named."""
    return [
        Path(expand_identity(f, resolved, alias)).absolute()
        for f in resolved.identity_files or openssh_default_keys()
        if f.lower() != "none"
    ]


def explicit_keys(resolved: Resolved, alias: str) -> list[Path]:
    """The identity files the configuration names, expanded as OpenSSH does; [] when it
    names none (only OpenSSH's defaults are listed)."""
    if names_defaults(resolved.identity_files, openssh_default_keys()):
        return []
    return identity_paths(resolved, alias)


def default_config() -> Path | None:
    """$PROVISIONER_SSH_CONFIG when set (tests point it at their hidden home), else None:
    ssh reads ~/.ssh/config and /etc/ssh/ssh_config as it always does."""
    explicit = os.environ.get("PROVISIONER_SSH_CONFIG")
    if not explicit:
        return None
    path = Path(explicit).expanduser()
    if not path.is_file():  # read as an empty one, it would hide the user's Hosts unsaid
        raise InventoryError(
            f"names {path}, which is not a file",
            "point it at an ssh_config file (an empty one reads none), or unset it: "
            "ssh then reads ~/.ssh/config",
            where="PROVISIONER_SSH_CONFIG",
        )
    return path


def have_openssh() -> bool:
    return shutil.which("ssh") is not None


def ssh_g_command(alias: str, args: Sequence[str], config: Path | None) -> list[str]:
    """The `ssh -G` command line for `alias` (pure; `args` come before the host). A config
    file that does not exist is read as an empty one."""
    if config is not None and not config.exists():
        config = Path(os.devnull)
    return ["ssh", "-G", *(["-F", str(config)] if config else []), *args, "--", alias]


def run_ssh_g(alias: str, args: Sequence[str], config: Path | None) -> Resolved:
    """Ask OpenSSH what it would use for `alias`; configuration errors become InventoryErrors."""
    try:
        done = subprocess.run(
            ssh_g_command(alias, args, config),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InventoryError(
            f"cannot run ssh -G for {alias}: {exc}", f"check the ssh client ({OPENSSH_INSTALL})"
        ) from None
    if done.returncode != 0:
        raise _config_error(done.stderr, alias, config)
    return from_ssh_g(parse_ssh_g(done.stdout))


def _config_error(stderr: str, alias: str, config: Path | None) -> InventoryError:
    lines = [
        line
        for line in stderr.splitlines()
        if line.strip() and not line.startswith("Pseudo-terminal")
    ]
    match = _CONFIG_ERROR.search("\n".join(lines))
    if match:
        return InventoryError(
            f"ssh config: {match.group('message')}",
            "fix that line (see man ssh_config)",
            where=f"{match.group('path')}:{match.group('line')}",
        )
    said = "; ".join(lines) or "no message"
    return InventoryError(
        f"ssh -G refused the settings for {alias}: {said}",
        "fix the SSH options or the ssh config (see man ssh_config)",
        where=str(config) if config else None,
    )


# --- fallback without OpenSSH: paramiko's reader, refusing what it cannot read exactly ------

# ssh_config(5) keywords the fallback accepts (OpenSSH 9); any other word is refused, as
# OpenSSH refuses it, unless the file says IgnoreUnknown (then OpenSSH's reading is needed)
KEYWORDS = frozenset(
    [
        "host",
        "match",
        "include",
        "ignoreunknown",
        "hostname",
        "user",
        "port",
        "identityfile",
        "proxyjump",
        "proxycommand",
        "addkeystoagent",
        "addressfamily",
        "batchmode",
        "bindaddress",
        "bindinterface",
        "canonicaldomains",
        "canonicalizefallbacklocal",
        "canonicalizehostname",
        "canonicalizemaxdots",
        "canonicalizepermittedcnames",
        "casignaturealgorithms",
        "certificatefile",
        "checkhostip",
        "ciphers",
        "clearallforwardings",
        "compression",
        "connectionattempts",
        "connecttimeout",
        "controlmaster",
        "controlpath",
        "controlpersist",
        "dynamicforward",
        "enableescapecommandline",
        "enablesshkeysign",
        "escapechar",
        "exitonforwardfailure",
        "fingerprinthash",
        "forkafterauthentication",
        "forwardagent",
        "forwardx11",
        "forwardx11timeout",
        "forwardx11trusted",
        "gatewayports",
        "globalknownhostsfile",
        "gssapiauthentication",
        "gssapidelegatecredentials",
        "hashknownhosts",
        "hostbasedacceptedalgorithms",
        "hostbasedauthentication",
        "hostkeyalgorithms",
        "hostkeyalias",
        "identitiesonly",
        "identityagent",
        "ipqos",
        "kbdinteractiveauthentication",
        "kexalgorithms",
        "knownhostscommand",
        "localcommand",
        "localforward",
        "loglevel",
        "logverbose",
        "macs",
        "nohostauthenticationforlocalhost",
        "numberofpasswordprompts",
        "passwordauthentication",
        "permitlocalcommand",
        "permitremoteopen",
        "pkcs11provider",
        "preferredauthentications",
        "proxyusefdpass",
        "pubkeyacceptedalgorithms",
        "pubkeyauthentication",
        "rekeylimit",
        "remotecommand",
        "remoteforward",
        "requesttty",
        "requiredrsasize",
        "revokedhostkeys",
        "securitykeyprovider",
        "sendenv",
        "serveralivecountmax",
        "serveraliveinterval",
        "sessiontype",
        "setenv",
        "stdinnull",
        "streamlocalbindmask",
        "streamlocalbindunlink",
        "stricthostkeychecking",
        "syslogfacility",
        "tcpkeepalive",
        "tunnel",
        "tunneldevice",
        "updatehostkeys",
        "userknownhostsfile",
        "verifyhostkeydns",
        "visualhostkey",
        "xauthlocation",
    ]
)


def _fallback_refusal(text: str) -> tuple[int, str] | None:
    """The first line the fallback cannot read exactly as OpenSSH would, and why."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword = re.split(r"[\s=]", line, maxsplit=1)[0].lower()
        if keyword in ("include", "match", "ignoreunknown"):
            return number, f"{keyword.capitalize()} needs OpenSSH's ssh -G"
        if keyword not in KEYWORDS:
            return number, f"Bad configuration option: {keyword}"
        if "#" in line:
            return number, "a trailing comment needs OpenSSH's ssh -G"
        if "%" in line and keyword not in ("hostname", "proxycommand"):
            return number, "% tokens here need OpenSSH's ssh -G"
        if keyword == "identityfile" and "~" in line and not _tilde_as_openssh(line):
            return number, "~ here needs OpenSSH's ssh -G (paramiko expands it with $HOME)"
    return None


def _tilde_as_openssh(line: str) -> bool:
    """True when paramiko's ~ (every ~, with $HOME) is OpenSSH's (a leading ~/, with the
    account's home) for this IdentityFile line."""
    value = re.split(r"[\s=]+", line, maxsplit=1)[-1].strip().strip('"')
    return value.startswith("~/") and "~" not in value[1:] and Path.home() == login_home()


def _fallback_overrides(args: Sequence[str]) -> dict[str, str]:
    """Command-line options as ssh_config keys (first one wins, as in ssh)."""
    names = {"J": "proxyjump", "p": "port", "l": "user", "i": "identityfile"}
    found: dict[str, str] = {}
    items = iter(args)
    for arg in items:
        flag, value = arg[1:2], arg[2:]
        if flag in FLAGS_ALONE and all(c in FLAGS_ALONE for c in arg[1:]):
            continue
        if flag == "F" or flag not in (*names, "o"):
            raise InventoryError(
                f"ssh option {arg} needs OpenSSH's ssh -G, and no ssh client is installed",
                f"install it: {OPENSSH_INSTALL}",
            )
        value = value or next(items, "")
        if flag == "o":
            key, _, rest = value.replace("=", " ", 1).partition(" ")
            key, value = key.lower(), rest.strip().strip('"')
        else:
            key = names[flag]
        found.setdefault(key, value)
    return found


def paramiko_lookup(alias: str, args: Sequence[str], config: Path | None, home: Path) -> Resolved:
    """The fallback: paramiko reads the config file; Include and Match are refused."""
    path = config or home / ".ssh" / "config"
    overrides = _fallback_overrides(args)
    found: dict[str, object] = {}
    if path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace")
        refusal = _fallback_refusal(text)
        if refusal:
            raise InventoryError(
                f"ssh config: {refusal[1]}; no ssh client is installed to read it",
                f"install it: {OPENSSH_INSTALL}",
                where=f"{path}:{refusal[0]}",
            )
        try:
            found = dict(paramiko.SSHConfig.from_text(text).lookup(alias))
        except (ValueError, paramiko.ssh_exception.ConfigParseError) as exc:
            raise InventoryError(
                f"cannot read the ssh config: {exc}", "fix the file", where=str(path)
            ) from None
    keys = [overrides["identityfile"]] if "identityfile" in overrides else []
    listed = found.get("identityfile")
    keys += list(listed) if isinstance(listed, list) else []
    return Resolved(
        hostname=str(overrides.get("hostname") or found.get("hostname") or alias),
        user=str(overrides.get("user") or found.get("user") or ""),
        port=int(str(overrides.get("port") or found.get("port") or 22)),
        identity_files=tuple(keys),
        proxy_jump=_jump_as_openssh(_none(overrides.get("proxyjump") or found.get("proxyjump"))),
        proxy_command=_none(overrides.get("proxycommand") or found.get("proxycommand")),
        known_hosts=tuple(str(found.get("userknownhostsfile", "")).split()),
        refused=tuple(n for k, n in _REFUSED.items() if k in found or k in overrides),
    )


def _jump_as_openssh(jump: str | None) -> str | None:
    """ProxyJump as `ssh -G` writes it: the last hop as user@[host]:port when a port is set."""
    if not jump:
        return jump
    rest, _, last = jump.rpartition(",")
    spec = last.strip().removeprefix("ssh://").rstrip("/")
    user, at, hostport = spec.rpartition("@")
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        port = tail.removeprefix(":")
    else:
        host, _, port = hostport.partition(":")
    last = f"{user}{at}[{host}]:{port}" if port else f"{user}{at}{host}"
    return f"{rest},{last}" if rest else last


def _none(value: object) -> str | None:
    return None if value is None or str(value).lower() == "none" else str(value)


def lookup(
    alias: str, args: Sequence[str], config: Path | None, *, home: Path, openssh: bool | None = None
) -> Resolved:
    """What ssh would use for `alias` with `args` on its command line."""
    use_openssh = have_openssh() if openssh is None else openssh
    config = config or default_config()
    if use_openssh:
        return run_ssh_g(alias, args, config)
    return paramiko_lookup(alias, args, config, home)
