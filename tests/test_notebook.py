"""notebooks/quickstart.ipynb, executed cell by cell (nbclient)."""

import nbformat
import pytest

from tests.conftest import REPO_ROOT

nbclient = pytest.importorskip("nbclient")


@pytest.mark.slow
def test_quickstart_notebook_runs():
  path = REPO_ROOT / "notebooks" / "quickstart.ipynb"
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(path.parent)}})
  client.execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
  assert "round 20: test accuracy" in outputs
  assert "ARI" in outputs
  images = [o for c in nb.cells for o in c.get("outputs", []) if "data" in o
            and "image/png" in o["data"]]
  assert images, "the accuracy plot was not drawn"
