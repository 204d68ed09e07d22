"""The cross-check fixtures' one step with an authors' repository: files of
a commit of its git mirror (`fetch`'s copy: no work tree) written out
unmodified, so that the fixture imports them as they are."""
import os
import subprocess


def extract(mirror: str, commit: str, files: dict) -> None:
  """Writes each repository path of `files` ({repo path: local path}) at
  `commit` of the git directory `mirror` to its local path."""
  for path, out in files.items():
    os.makedirs(os.path.dirname(out), exist_ok=True)
    data = subprocess.run(["git", "-C", mirror, "show", f"{commit}:{path}"], check=True,
                          capture_output=True).stdout
    with open(out, "wb") as fh:
      fh.write(data)
