"""What a batch job may carry: the size limits and the environment rules, in one place.

The service applies them when a job is submitted (400 naming the field) and the privileged
launcher applies them again before it starts anything (defence in depth: a compromised
service user gets no further than a job could). docs/service.md ("Limits", "Security model")
lists them for users and admins. Standard library only: the launcher runs as root.
"""

from __future__ import annotations

import re

#: workload ids (also directory names under the jobs root)
WORKLOAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,199}$")
#: a variable name a job may give: letters, digits and '_', not starting with a digit
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MAX_COMMAND_CHARS = 8192  # a shell-string command
MAX_ARGV = 256  # items of a list command
MAX_ARG_CHARS = 4096  # one item
MAX_ARGV_CHARS = 32768  # all items together
MAX_ENV = 64  # variables in a job's env
MAX_ENV_KEY_CHARS = 128
MAX_ENV_VALUE_CHARS = 4096
MAX_NAME_CHARS = 200  # a job's name
MAX_NOTE_CHARS = 2000  # a grant change's note

#: the PATH a job gets (and the service resolves command names with) unless the admin sets one
DEFAULT_JOB_PATH = "/usr/local/bin:/usr/bin:/bin"

#: variables a job's own ``env`` may not set: set by the launcher itself (HOME, PATH, ...),
#: read by the dynamic loader or libc, or start-up hooks of shells and interpreters that would
#: run other code than the command the admin allowed
REFUSED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "IFS", "ENV", "BASH_ENV", "CDPATH",
    "GLOBIGNORE", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "GLIBC_TUNABLES",
    "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF", "LOCALDOMAIN", "RES_OPTIONS",
    "TZDIR", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH",
    "R_PROFILE", "R_PROFILE_USER", "R_ENVIRON", "R_ENVIRON_USER", "R_LIBS", "R_LIBS_USER",
    "JULIA_LOAD_PATH", "JULIA_DEPOT_PATH", "LUA_PATH", "LUA_CPATH", "TCLLIBPATH",
    "OPENSSL_CONF", "OPENSSL_MODULES", "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE", "VIRTUAL_ENV",
})
#: prefixes of refused names: the loader (LD_*), Python start-up (PYTHON*: PYTHONPATH,
#: PYTHONSTARTUP, ...), the service's own (GPUBUDGET_*: about the job, set by the service),
#: JupyterHub's tokens and URLs, the placement's devices (CUDA_VISIBLE_DEVICES, MPS limits,
#: NVIDIA_*), and other interpreters' hooks
REFUSED_PREFIXES = ("LD_", "DYLD_", "PYTHON", "GPUBUDGET_", "JUPYTERHUB_", "JPY_",
                    "CUDA_VISIBLE", "CUDA_MPS_", "NVIDIA_", "MALLOC_", "BASH_FUNC_", "GCONV_",
                    "PERL", "RUBY", "NODE_", "CONDA")

#: what the service itself puts in a job's environment (the launcher accepts only these in
#: the spec's ``job_env``)
SERVICE_ENV = frozenset({
    "CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY", "GPUBUDGET_WORKLOAD",
    "GPUBUDGET_PROJECT",
    "GPUBUDGET_USER", "GPUBUDGET_ATTEMPT", "GPUBUDGET_PLACEMENT", "GPUBUDGET_DUE_AT",
    "GPUBUDGET_CHECKPOINT", "GPUBUDGET_ARRAY_INDEX", "GPUBUDGET_ARRAY_ID",
    "GPUBUDGET_WARN_SIGNAL",
})


def bad_text(s: str) -> str | None:
    """Why a string cannot be stored or passed to a process (NUL, lone surrogates), or None."""
    if "\x00" in s:
        return "contains a NUL character"
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


def refused_env_key(key: str) -> str | None:
    """Why a job's ``env`` may not set ``key``, or None."""
    if len(key) > MAX_ENV_KEY_CHARS:
        return f"a variable name is at most {MAX_ENV_KEY_CHARS} characters"
    if not ENV_KEY.fullmatch(key):
        return "not a variable name (letters, digits and '_', not starting with a digit)"
    up = key.upper()
    if up in REFUSED_NAMES or up.startswith(REFUSED_PREFIXES):
        return ("may not be set by a job: the service or the system sets it, or it changes "
                "what runs (see 'Security model' in docs/service.md)")
    return None


def env_problem(env: object) -> tuple[str, str] | None:
    """``(field, message)`` for the first problem of a job's ``env`` mapping, or None."""
    if not isinstance(env, dict):
        return "env", "expected a mapping of strings to strings"
    if len(env) > MAX_ENV:
        return "env", f"at most {MAX_ENV} variables"
    for k, v in env.items():
        if not isinstance(k, str) or not isinstance(v, str):
            return "env", "expected a mapping of strings to strings"
        field = f"env.{k}" if len(k) <= MAX_ENV_KEY_CHARS and not bad_text(k) else "env"
        why = bad_text(k) or refused_env_key(k)
        if why:
            return field, why
        if len(v) > MAX_ENV_VALUE_CHARS:
            return field, f"a value is at most {MAX_ENV_VALUE_CHARS} characters"
        why = bad_text(v)
        if why:
            return field, why
    return None


def argv_problem(argv: object) -> tuple[str, str] | None:
    """``(field, message)`` for the first problem of a list command, or None."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return "command", "expected a string or a non-empty list of strings"
    if len(argv) > MAX_ARGV:
        return "command", f"at most {MAX_ARGV} arguments"
    if sum(len(a) for a in argv) > MAX_ARGV_CHARS:
        return "command", f"at most {MAX_ARGV_CHARS} characters in all"
    for i, a in enumerate(argv):
        if len(a) > MAX_ARG_CHARS:
            return f"command[{i}]", f"an argument is at most {MAX_ARG_CHARS} characters"
        why = bad_text(a)
        if why:
            return f"command[{i}]", why
    if not argv[0].strip():
        return "command[0]", "the program is empty"
    return None
