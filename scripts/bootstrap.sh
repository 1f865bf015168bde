#!/usr/bin/env bash
# Create or reuse the project's virtual environment (.venv in the repo root) and install the
# provider with its test dependencies. Safe to run again: the install is skipped while
# pyproject.toml, setup.py and the C source of protocol/ are unchanged since the last successful one.
#
# It changes nothing outside the venv unless asked:
#   --with-browser   also install Debian's chromium system-wide (apt-get, as root) for tests/ui;
#                    same as PRAVEGA_BOOTSTRAP_BROWSER=1. scripts/test asks for it.
#   --with-postgres  also install the provider's `postgres` extra (asyncpg, psycopg2-binary: an
#                    Airflow metadata DB on PostgreSQL); same as PRAVEGA_BOOTSTRAP_POSTGRES=1.
#   --with-build-tools  also make sure Maven (mvn: the HDFS test fetches Hadoop's minicluster) is
#                    there, apt-get installing Debian's maven when run as root;
#                    same as PRAVEGA_BOOTSTRAP_BUILD_TOOLS=1. scripts/test asks for it.
#
# Environment: PYTHON  interpreter to build the venv with: CPython 3.11-3.13 (default: python3.11,
#                      the CI interpreter; the official `pravega` client installs on 3.10/3.11 only)
#              VENV    where the environment lives (default: <repo>/.venv; a relative path is taken
#                      from the repository root, e.g. VENV=.venv-3.13)
#              PRAVEGA_CONSTRAINTS  which tested stack to install: a file of constraints/ (pip -c);
#                      default constraints/default.txt. pyproject.toml has the supported ranges;
#                      each file pins one end of them (README: compatibility matrix).
#
# A venv built with another Python than the one PYTHON names is rebuilt.
set -euo pipefail

with_browser="${PRAVEGA_BOOTSTRAP_BROWSER:-0}"
with_postgres="${PRAVEGA_BOOTSTRAP_POSTGRES:-0}"
with_build_tools="${PRAVEGA_BOOTSTRAP_BUILD_TOOLS:-0}"
for arg in "$@"; do
    case "$arg" in
    --with-browser) with_browser=1 ;;
    --with-postgres) with_postgres=1 ;;
    --with-build-tools) with_build_tools=1 ;;
    -h | --help)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
        exit 0
        ;;
    *)
        printf 'bootstrap: unknown argument %q (known: --with-browser, --with-postgres, --with-build-tools)\n' "$arg" >&2
        exit 2
        ;;
    esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3.11}"
venv="${VENV:-.venv}"
[[ "$venv" == /* ]] || venv="$root/$venv"
stamp="$venv/.airflow-provider-pravega-install.sha256"

fail() {
    printf 'bootstrap: %s\n' "$*" >&2
    exit 1
}

# --- Maven for the tests, only when asked ----------------------------------------------
if [[ "$with_build_tools" == "1" ]]; then
    missing=()
    command -v mvn >/dev/null 2>&1 || missing+=(maven)
    if ((${#missing[@]})); then
        if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
            echo "bootstrap: installing Debian's ${missing[*]} system-wide (apt-get) for the tests (mvn: the HDFS minicluster)"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
                fail "'apt-get install ${missing[*]}' failed; install them and run again"
        else
            fail "the tests need ${missing[*]} (mvn fetches the HDFS minicluster).
  Debian/Ubuntu (as root): apt-get install -y ${missing[*]}"
        fi
    fi
fi

# --- Java 17+ (PySpark runs on the JVM) ---------------------------------------------------------
java_bin="java"
if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
    java_bin="$JAVA_HOME/bin/java"
fi
if ! command -v "$java_bin" >/dev/null 2>&1; then
    fail "Java 17 or newer is required (Spark runs on it) and no 'java' was found.
  Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless
  Or point JAVA_HOME at a JDK/JRE 17+ installation."
fi
java_version="$("$java_bin" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)"
java_major="${java_version%%.*}"
if [[ "$java_major" == "1" ]]; then # 1.8 style
    java_major="$(echo "$java_version" | cut -d. -f2)"
fi
if ! [[ "$java_major" =~ ^[0-9]+$ ]] || ((java_major < 17)); then
    fail "Java 17 or newer is required; '$java_bin' is version '${java_version:-unknown}'.
  Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless
  Or point JAVA_HOME at a JDK/JRE 17+ installation."
fi

# --- Chromium for tests/ui (the connection form in a real browser), only when asked ------------
# Debian's chromium, driven by Playwright (Playwright's own browser download does not work
# offline). Optional: without it the UI test skips and says why; nothing here stops the bootstrap.
chromium_bin="${PRAVEGA_UI_CHROMIUM:-/usr/bin/chromium}"
if [[ "$with_browser" == "1" && ! -x "$chromium_bin" ]]; then
    if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing Debian's 'chromium' package system-wide (apt-get update + install, about a minute) for tests/ui"
        if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; then
            echo "bootstrap: warning: 'apt-get install chromium' failed; tests/ui will be skipped" >&2
        fi
    else
        echo "bootstrap: no $chromium_bin: tests/ui will be skipped. To run them, install Chromium:
  Debian/Ubuntu (as root): apt-get update && apt-get install -y chromium" >&2
    fi
fi
# --- end of Chromium for tests/ui --------------------------------------------------------------

# --- Python 3.11-3.13 (what Apache's providers support) ---------------------------------------
supported='import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 13)))'
version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

want_version=""
if command -v "$python" >/dev/null 2>&1; then
    # `|| true`: a command that exists but does not run (a pyenv shim of an inactive version) must
    # reach the error below, not end the script silently under `set -e`.
    want_version="$(version_of "$python" || true)"
fi
venv_is_usable() {
    [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$supported" 2>/dev/null &&
        # PYTHON named another version than the venv's: rebuild it with that one.
        [[ -z "${PYTHON:-}" || "$(version_of "$venv/bin/python")" == "$want_version" ]]
}

if ! venv_is_usable; then
    if [[ -z "$want_version" ]]; then
        fail "'$python' not found or not runnable (a pyenv shim needs its version active, or give the full path: PYTHON=\$(pyenv root)/versions/3.13.0/bin/python3.13). Python 3.11, 3.12 or 3.13 is required (3.11 by default: the
  official 'pravega' client, the tests' reference, ships wheels for CPython 3.10 and 3.11 only).
  Debian/Ubuntu: apt-get install -y python3.11 python3.11-venv   (or: pyenv install 3.11)
  Or set PYTHON=/path/to/python3.X (3.11-3.13), e.g. with VENV=.venv-3.13 for a separate venv."
    fi
    if ! "$python" -c "$supported"; then
        fail "'$python' is Python $("$python" -c 'import platform; print(platform.python_version())'), not 3.11-3.13. Set PYTHON=/path/to/python3.X (3.11-3.13)."
    fi
    echo "bootstrap: creating $venv with $("$python" -c 'import sys; print(sys.executable)') (Python $want_version)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi

# --- install, unless pyproject.toml is unchanged since the last successful install ------------
# spark: classic local sessions (the embedded default); embedded: the embedded server.
extras="spark,embedded,test,bench"
constraints="${PRAVEGA_CONSTRAINTS:-constraints/default.txt}"
[[ "$constraints" == /* ]] || constraints="$root/$constraints"
[[ -f "$constraints" ]] || fail "PRAVEGA_CONSTRAINTS names $constraints, which does not exist (see constraints/)"
# setup.py and the C source too: an editable install builds the optional extension once, not on
# each change of its source.
want="$(cat "$root/pyproject.toml" "$root/setup.py" "$constraints" "$root"/airflow_provider_pravega/protocol/*.c | sha256sum | cut -d' ' -f1)"
if [[ "$with_postgres" == "1" ]]; then
    extras="$extras,postgres"
    want="$want+postgres"
fi
# A venv that also has the postgres extra is up to date for a bootstrap without it.
if [[ -f "$stamp" && ("$(cat "$stamp")" == "$want" || "$(cat "$stamp")" == "$want+postgres") ]]; then
    echo "bootstrap: $venv is up to date (pyproject.toml, setup.py and the C source unchanged)"
    exit 0
fi
rm -f "$stamp"
echo "bootstrap: installing airflow-provider-pravega[$extras] into $venv with ${constraints#"$root"/} (a few minutes the first time)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$constraints" -e "$root[$extras]"
echo "$want" >"$stamp"
echo "bootstrap: done"
