"""The jars a Spark session on the broker's catalog needs, found or built (relocated) here.

Jars come from places this machine can reach (no Maven at run time):
  - the Iceberg Spark runtime: the PyPI package `snowpark-connect-deps-iceberg`;
  - the Jackson classes that runtime jar lacks (it expects them relocated under
    `org.apache.iceberg.shaded.`): pyspark's own Jackson jars, relocated once with jarjar
    (Debian `libjarjar-java`) and cached;
  - JDBC drivers: Debian `libxerial-sqlite-jdbc-java`, `libpostgresql-jdbc-java`;
  - for REST catalogs, Apache HttpClient 5.4+, which that runtime jar also lacks, relocated
    the same way. Nothing reachable here has it (Debian bookworm's libhttpclient5-java is
    5.2): REST needs FLOE_HTTPCLIENT5_JARS, or the official runtime jar (which has Jackson and
    HttpClient inside) as FLOE_ICEBERG_RUNTIME_JAR.
Each can be pointed elsewhere with an environment variable (FLOE_ICEBERG_RUNTIME_JAR,
FLOE_JARJAR_JAR, FLOE_SQLITE_JDBC_JAR, FLOE_POSTGRESQL_JDBC_JAR, FLOE_HTTPCLIENT5_JARS); the
cache lives in $FLOE_CACHE_DIR (default $XDG_CACHE_HOME/floe or ~/.cache/floe).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from spark_compaction.catalog import catalog_kind

ICEBERG_RUNTIME = "iceberg-spark-runtime-3.5_2.12-*.jar"
SHADED = "org.apache.iceberg.shaded"
JACKSON_RULES = f"rule com.fasterxml.jackson.** {SHADED}.com.fasterxml.jackson.@1\n"
HTTPCLIENT_RULES = f"rule org.apache.hc.** {SHADED}.org.apache.hc.@1\n"
JACKSON_PROBE = "org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactoryBuilder.class"
HTTPCLIENT_PROBE = (
    "org/apache/iceberg/shaded/org/apache/hc/client5/http/ssl/TlsSocketStrategy.class"
)
HTTPCLIENT_NEEDED = "org/apache/hc/client5/http/ssl/TlsSocketStrategy.class"  # 5.4 and later
_BUILD_VERSION = "1"  # bump to rebuild every cached jar

DEBIAN_JARS = {  # what -> (Debian package, candidate paths, env override)
    "jarjar": ("libjarjar-java", ["/usr/share/java/jarjar.jar"], "FLOE_JARJAR_JAR"),
    "sqlite": (
        "libxerial-sqlite-jdbc-java",
        ["/usr/share/java/sqlite-jdbc.jar", "/usr/share/java/xerial-sqlite-jdbc.jar"],
        "FLOE_SQLITE_JDBC_JAR",
    ),
    "postgresql": (
        "libpostgresql-jdbc-java",
        ["/usr/share/java/postgresql.jar"],
        "FLOE_POSTGRESQL_JDBC_JAR",
    ),
}


class SparkSetupError(RuntimeError):
    """Something Spark needs is missing; the message says what to install."""


def cache_dir() -> Path:
    if os.environ.get("FLOE_CACHE_DIR"):
        return Path(os.environ["FLOE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "floe"


def iceberg_runtime_jar() -> Path:
    """$FLOE_ICEBERG_RUNTIME_JAR (e.g. the official jar from Maven Central), else the one in
    the PyPI package snowpark-connect-deps-iceberg."""
    if os.environ.get("FLOE_ICEBERG_RUNTIME_JAR"):
        p = Path(os.environ["FLOE_ICEBERG_RUNTIME_JAR"])
        if not p.is_file():
            raise SparkSetupError(f"FLOE_ICEBERG_RUNTIME_JAR={p}: no such file")
        return p
    spec = importlib.util.find_spec("snowpark_connect_deps_iceberg")
    if spec is None or spec.origin is None:
        raise SparkSetupError(
            "the Iceberg Spark runtime jar is missing: pip install snowpark-connect-deps-iceberg "
            "(or set FLOE_ICEBERG_RUNTIME_JAR)"
        )
    jars_dir = Path(spec.origin).parent / "jars"
    found = sorted(jars_dir.glob(ICEBERG_RUNTIME))
    if not found:
        raise SparkSetupError(f"no {ICEBERG_RUNTIME} in {jars_dir}")
    return found[-1]


@functools.cache
def _jar_entries(path: Path, mtime: float) -> frozenset[str]:
    with zipfile.ZipFile(path) as z:
        return frozenset(z.namelist())


def jar_has(path: Path, entry: str) -> bool:
    return entry in _jar_entries(path.resolve(), path.stat().st_mtime)


def pyspark_jars_dir() -> Path:
    try:
        import pyspark
    except ImportError:
        raise SparkSetupError("pyspark is missing: pip install 'pyspark==3.5.*'") from None
    return Path(pyspark.__file__).parent / "jars"


def debian_jar(what: str) -> Path:
    """A jar Debian installs (or the file named by its FLOE_* environment variable)."""
    package, candidates, env = DEBIAN_JARS[what]
    if os.environ.get(env):
        p = Path(os.environ[env])
        if not p.is_file():
            raise SparkSetupError(f"{env}={p}: no such file")
        return p
    for c in candidates:
        if Path(c).is_file():
            return Path(c)
    raise SparkSetupError(
        f"{what} jar not found ({', '.join(candidates)}): install the Debian package {package} "
        f"(apt-get install {package}) or set {env} to the jar"
    )


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").is_file():
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if not found:
        raise SparkSetupError("java not found: install a JDK 17 (apt-get install openjdk-17-jdk)")
    return found


def _merge_jars(sources: Iterable[Path], out: Path) -> None:
    """One jar with every class of `sources`: no multi-release, signature, module or service
    files (they would name classes by their unrelocated names)."""
    seen: set[str] = set()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for src in sources:
            with zipfile.ZipFile(src) as z:
                for info in z.infolist():
                    n = info.filename
                    upper = n.upper()
                    if (
                        n in seen
                        or n.endswith("/")
                        or n.startswith(("META-INF/versions/", "META-INF/services/"))
                        or n.endswith("module-info.class")
                        or (
                            upper.startswith("META-INF/")
                            and upper.endswith((".SF", ".RSA", ".DSA", ".EC", "MANIFEST.MF"))
                        )
                    ):
                        continue
                    seen.add(n)
                    dst.writestr(n, z.read(n))


def relocated_jar(name: str, sources: Sequence[Path], rules: str) -> Path:
    """`sources` merged and relocated by jarjar `rules`, built once into the cache."""
    jarjar = debian_jar("jarjar")
    key = hashlib.sha256(_BUILD_VERSION.encode() + rules.encode())
    for s in [jarjar, *sources]:
        st = s.stat()
        key.update(f"{s.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode())
    target = cache_dir() / "jars" / f"{name}-{key.hexdigest()[:16]}.jar"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        merged, rules_file, out = Path(tmp, "in.jar"), Path(tmp, "rules.txt"), Path(tmp, "out.jar")
        _merge_jars(sources, merged)
        rules_file.write_text(rules)
        cmd = [java_binary(), "-cp", str(jarjar), "com.tonicsystems.jarjar.Main"]
        r = subprocess.run(
            [*cmd, "process", str(rules_file), str(merged), str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0 or not out.is_file():
            raise SparkSetupError(f"jarjar failed building {name}: {r.stderr.strip()[-2000:]}")
        os.replace(out, target)  # atomic: concurrent builders both end with a whole jar
    return target


def jackson_jar() -> Path:
    """pyspark's Jackson relocated where the Iceberg runtime jar looks for it."""
    jars = pyspark_jars_dir()
    sources = []
    for part in ("core", "databind", "annotations"):
        found = sorted(jars.glob(f"jackson-{part}-[0-9]*.jar"))
        if not found:
            raise SparkSetupError(f"no jackson-{part} jar in {jars}")
        sources.append(found[-1])
    return relocated_jar("iceberg-jackson", sources, JACKSON_RULES)


def httpclient_jar() -> Path:
    """Apache HttpClient 5.4+ relocated for Iceberg's REST client: the jars named by
    $FLOE_HTTPCLIENT5_JARS (httpclient5, httpcore5, httpcore5-h2; os.pathsep-separated), else
    Debian's libhttpclient5-java if it is recent enough (bookworm's 5.2 is not)."""
    env = os.environ.get("FLOE_HTTPCLIENT5_JARS")
    if env:
        sources = [Path(p) for p in env.split(os.pathsep) if p]
    else:
        sources = [
            Path(p)
            for pattern in ("httpclient5.jar", "httpcore5.jar", "httpcore5-h2.jar")
            for p in sorted(glob.glob(f"/usr/share/java/{pattern}"))
        ]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise SparkSetupError(f"FLOE_HTTPCLIENT5_JARS: no such file(s): {', '.join(missing)}")
    if not any(jar_has(p, HTTPCLIENT_NEEDED) for p in sources):
        found = ", ".join(str(p) for p in sources) or "none"
        raise SparkSetupError(
            "a REST catalog needs Apache HttpClient 5.4 or later, which the Iceberg runtime jar "
            f"of snowpark-connect-deps-iceberg leaves out (jars found: {found}; Debian "
            "bookworm's libhttpclient5-java is 5.2). Set FLOE_ICEBERG_RUNTIME_JAR to the "
            "official iceberg-spark-runtime-3.5_2.12 jar (Maven Central), or "
            "FLOE_HTTPCLIENT5_JARS to httpclient5, httpcore5 and httpcore5-h2 5.4+ jars"
        )
    return relocated_jar("iceberg-httpclient5", sources, HTTPCLIENT_RULES)


def required_jars(catalog_url: str) -> list[Path]:
    """Every jar a session on this catalog needs, prepared (built) if need be. Only what the
    runtime jar lacks is added (the official runtime jar has Jackson and HttpClient inside)."""
    runtime = iceberg_runtime_jar()
    jars = [runtime]
    if not jar_has(runtime, JACKSON_PROBE):
        jars.append(jackson_jar())
    kind = catalog_kind(catalog_url)
    if kind in ("sqlite", "postgresql"):
        jars.append(debian_jar(kind))
    elif not jar_has(runtime, HTTPCLIENT_PROBE):
        jars.append(httpclient_jar())
    return jars
