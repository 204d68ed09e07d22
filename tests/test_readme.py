"""The README's "Using the library" code, executed as written."""

import re

from tests.conftest import REPO_ROOT


def _snippets():
  text = (REPO_ROOT / "README.md").read_text()
  section = text[text.index("## Using the library"):]
  section = section[:section.index("\n## ", 3)]
  return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_library_snippets_run(monkeypatch):
  monkeypatch.chdir(REPO_ROOT)
  snippets = _snippets()
  assert len(snippets) >= 2
  namespace = {}
  for code in snippets:  # later snippets reuse earlier imports, as a reader would
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102
  assert 0 <= namespace["out"].metrics["test_accuracy"] <= 1
  assert 0 <= namespace["summary"]["max_test_accuracy"] <= 1
