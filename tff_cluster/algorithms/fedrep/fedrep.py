"""FedRep (Collins et al., "Exploiting Shared Representations for
Personalized Federated Learning", ICML 2021): a shared representation (the
body) and a personal head, trained one after the other.

Rule (the authors' code, lgcollins/FedRep `models/Update.py`,
`LocalUpdate.train`, and `main_fedrep.py`): a sampled client loads the global
body and its own head, trains the **head only** for `--fedrep_head_epochs`
epochs (the code's E - E_rep, 10 in every setting), then the **body only** for
the run's local work (the code's E_rep epochs), and sends the body; the server
averages the bodies (`--client_weighting`; the code weighs 1 on CIFAR/MNIST,
n_k on FEMNIST/Sent140). Here each phase is one runner call (mode `head`,
then `body`), each with a fresh optimizer (the code builds a new SGD every
round), the other part frozen by the optimizer's mask. Each client is tested
with the global body and its own head; one never sampled holds the initial
head.

Left out: the code's last round, where every client trains its head for
max(10, E - E_rep) epochs before the final test, and its headline, the mean
over the last 10 rounds; the score here is the final round's.
"""

from __future__ import annotations

from tff_cluster.algorithms import personal
from tff_cluster.core import personal as parts
from tff_cluster.host import driver
from tff_cluster.learning import schedule


def definition(context: driver.Context) -> personal.SplitDefinition:
  """The head (`--head_layers` / `--head_names`) personal, the body shared;
  modes `head` and `body`, each training its part alone."""
  options = context.options
  return personal.split_definition(
      context, parts.head_indices(context.model.model_fn(), options.head_layers,
                                  options.head_names, "fedrep"),
      modes=("head", "body"))


class FedRepDriver(personal.PersonalDriver):
  """Each round: `--fedrep_head_epochs` epochs of the head, then the run's
  local work of the body."""

  def __init__(self, context: driver.Context, definition: personal.SplitDefinition):
    super().__init__(context, definition)
    head_work = schedule.LocalWork(self.config.batch_size,
                                   epochs=self.options.fedrep_head_epochs)
    self.phases = [("head", head_work), ("body", None)]
