"""pFedGraph: a personal model per client, aggregated over a collaboration graph the server infers each round."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

PFEDGRAPH_OPTIONS = hp.grouped(
    "pfedgraph",
    hp.HParam("pfedgraph_alpha", float, 0.8, "alpha: the graph's pull toward the clients' "
              "data shares (each row minimises alpha ||a||^2 + (d - 2 alpha p)^T a on the "
              "simplex; the authors' scripts: 0.8).", low=0, low_open=True),
    hp.HParam("pfedgraph_lam", float, 0.01, "lambda: weight of the local term lambda <c, w> "
              "/ ||w|| = lambda sum_j a_j cos(w, w_j) (the authors' default: 0.01; 0: none).",
              low=0),
    hp.HParam("pfedgraph_sign", str, "code", "Sign of the local term: code (+lambda, every "
              "port of the authors' code: pushes w from its neighbours' direction) or pull "
              "(-lambda: toward it, the paper's sign as the repository's issue #1 reports "
              "it).", choices=("code", "pull")),
    hp.HParam("pfedgraph_measure", str, "all", "What the graph's cosines compare of each "
              "client's change since the start w_0: all (every trainable weight, the "
              "authors' default) or fc (the Dense kernels only, the TensorFlow port's "
              "'fc').", choices=("all", "fc")),
    hp.HParam("pfedgraph_weight_decay", float, 1e-5, "Coupled L2 weight decay of the local "
              "steps (g + wd w; the authors' --reg: 1e-5).", low=0),
)

SPECS = (
    AlgorithmSpec(
        "pfedgraph", "pFedGraph: personal models aggregated over a collaboration graph "
        "inferred from their similarity", f"{__name__}.pfedgraph", host="PFedGraphDriver",
        hparams=PFEDGRAPH_OPTIONS,
        # A strong local term and a small alpha: graph rows with zeros, some
        # clients' pull set by an earlier round (partial participation).
        parity=({"pfedgraph_lam": 0.5, "pfedgraph_alpha": 0.05},
                {"pfedgraph_sign": "pull", "pfedgraph_measure": "fc",
                 "pfedgraph_weight_decay": 0.01})),
)
