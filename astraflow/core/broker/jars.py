"""The local broker's jars: fetched from Maven Central with ``mvn`` once, into a cache.

Also the checks for the tools the broker needs (Maven, Java 17+), with what to install when missing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from astraflow.core.errors import BrokerError

INSTALL_HINT = "apt-get install -y openjdk-17-jre-headless maven"
MIN_JAVA = 17
_MARKER = ".astraflow-complete"
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}

Progress = Callable[[str], None]


def tail_text(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def cache_dir() -> Path:
    """``$ASTRAFLOW_CACHE`` or ``~/.cache/astraflow``."""
    return Path(os.environ.get("ASTRAFLOW_CACHE") or Path.home() / ".cache" / "astraflow")


def _pom_bytes() -> bytes:
    return resources.files("astraflow.core.broker").joinpath("pom.xml").read_bytes()


def kafka_version() -> str:
    """The Kafka version the packaged pom.xml declares."""
    root = ET.fromstring(_pom_bytes())
    node = root.find("m:properties/m:kafka.version", _POM_NS)
    if node is None or not (node.text or "").strip():
        raise BrokerError("the packaged pom.xml declares no <kafka.version> property")
    return (node.text or "").strip()


def jars_dir() -> Path:
    """Where :func:`fetch_jars` puts the broker's classpath."""
    return cache_dir() / f"kafka-{kafka_version()}" / "libs"


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        what = "Java 17+" if tool == "java" else "Maven"
        raise BrokerError(f"`{tool}` not found on PATH: the local Kafka broker needs {what}. "
                          f"Install Java 17+ and Maven, e.g.: {INSTALL_HINT}")
    return path


def java_major(version_output: str) -> int | None:
    """The major version in ``java -version`` output (``1.8.0_392`` → 8, ``17.0.15`` → 17)."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def require_java() -> str:
    """The path of a Java 17+ ``java``; BrokerError saying what to install otherwise."""
    java = _require("java")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BrokerError(f"could not run `{java} -version`: {e}") from e
    text = out.stderr + out.stdout
    major = java_major(text)
    if major is None or major < MIN_JAVA:
        found = text.strip().splitlines()[0] if text.strip() else "unknown version"
        raise BrokerError(f"Kafka {kafka_version()} needs Java {MIN_JAVA}+, found {found!r} at "
                          f"{java}. Install a newer JDK, e.g.: {INSTALL_HINT}")
    return java


def fetch_jars(progress: Progress | None = None) -> Path:
    """Fetch the broker's jars from Maven Central once; return the classpath directory.

    Idempotent and instant once done (a marker file records the pom it was fetched for).
    The fetch goes to a temporary directory renamed into place, so an interrupted fetch
    leaves nothing half-done behind.
    """
    pom = _pom_bytes()
    stamp = hashlib.sha256(pom).hexdigest()
    target = jars_dir()
    marker = target / _MARKER
    if marker.is_file() and marker.read_text().strip() == stamp:
        return target
    say = progress or (lambda _msg: None)
    mvn = _require("mvn")
    require_java()
    version = kafka_version()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="libs.tmp-", dir=target.parent))
    work = Path(tempfile.mkdtemp(prefix="pom-"))
    try:
        (work / "pom.xml").write_bytes(pom)
        cmd = [mvn, "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
               "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"]
        say(f"Fetching Apache Kafka {version} jars from Maven Central")
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired as e:
            raise BrokerError(f"mvn did not finish fetching the Kafka {version} jars in "
                              f"{e.timeout:.0f}s: {' '.join(cmd)}") from e
        if proc.returncode != 0:
            tail = tail_text(proc.stdout + proc.stderr, 30)
            raise BrokerError(f"mvn failed (exit {proc.returncode}) fetching the Kafka {version} "
                              f"jars; command: {' '.join(cmd)}\n{tail}")
        if not any(tmp.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"mvn succeeded but no kafka_2.13 jar is in {tmp}")
        (tmp / _MARKER).write_text(stamp + "\n")
        if target.exists():  # fetched for another pom: replace it
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (marker.is_file() and marker.read_text().strip() == stamp):
                raise
            # Another process finished the same fetch first: use theirs.
        say(f"Fetched {sum(1 for _ in target.glob('*.jar'))} jars into {target} "
            f"in {time.monotonic() - t0:.1f}s")
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
