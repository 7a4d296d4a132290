"""Install the .debs of DEBS_DIR with dpkg, then copy every file they installed (and dpkg's updated database) into
STAGING_DIR, so that a later build stage can COPY exactly those files onto a clean copy of the base image.

Merged /usr: a package's /lib/x.so is /usr/lib/x.so on the image, so each path is canonicalized through its
directory; the /lib -> usr/lib links themselves are never copied."""

import os
import subprocess
import sys
from pathlib import Path

debs, staging = Path(sys.argv[1]), Path(sys.argv[2])
files = sorted(str(p) for p in debs.glob("*.deb"))
subprocess.run(["dpkg", "-i", *files], check=True, stdout=subprocess.DEVNULL)
names = [subprocess.run(["dpkg-deb", "-f", f, "Package"], check=True, capture_output=True, text=True).stdout.strip()
         for f in files]
listed = subprocess.run(["dpkg", "-L", *names], check=True, capture_output=True, text=True).stdout.splitlines()
listed += ["/var/lib/dpkg/status", "/etc/ld.so.cache"] + [str(p) for p in Path("/var/lib/dpkg/info").iterdir()]
paths = set()
for raw in listed:
    if raw in ("", "/."):
        continue
    path = os.path.join(os.path.realpath(os.path.dirname(raw)), os.path.basename(raw))
    if os.path.lexists(path) and not (os.path.islink(path) and os.path.isdir(path)):
        paths.add(path)
staging.mkdir(parents=True)
archive = subprocess.run(["tar", "-cf", "-", "--no-recursion", "-T", "-"], input="\n".join(sorted(paths)).encode(),
                         check=True, capture_output=True).stdout
subprocess.run(["tar", "-xf", "-", "-C", str(staging)], input=archive, check=True)
print(f"staged {len(paths)} paths of {len(names)} packages")
