"""CFL-MGD: IFCA's cluster estimates with momentum."""

from tff_cluster.algorithms import ifca
from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

CFL_MGD_OPTIONS = hp.grouped(
    "cfl_mgd",
    hp.NUM_GROUPS,
    hp.HParam("cfl_mgd_option", str, "model", "Option II, model averaging of local momentum "
              "steps started from the cluster's buffer (model), or option I, averaging of "
              "client momentum buffers of one gradient (gradient).",
              choices=("model", "gradient")),
    hp.HParam("cfl_mgd_beta", float, 0.9, "beta: the momentum coefficient.", low=0, high=1,
              high_open=True),
    hp.HParam("cfl_mgd_buffer", str, "client", "Option I: u_i held by the client (the "
              "paper) or started from its cluster's u_p (server).",
              choices=("client", "server")),
    hp.HParam("grad_avg_norm", str, "total", "Option I: the server step's divisor: the total "
              "number of clients (the paper's m) or the cluster's members this round.",
              choices=("total", "members")),
    hp.HParam("cfl_mgd_grad_batches", int, 1, "Option I: batches of the round's schedule "
              "the client's gradient is the mean over (0 = all).", low=0,
              limit=hp.MAX_LOCAL_STEPS),
    # IFCA's cluster estimate, initialisation and evaluation, shared.
    *(d for d in ifca.IFCA_OPTIONS if d.name in (
        "ifca_loss_batches", "ifca_init", "ifca_warm_rounds", "ifca_forced_rounds",
        "ifca_good_init_threshold", "ifca_eval", "ifca_init_clients")),
)

SPECS = (
    AlgorithmSpec(
        "cfl_mgd", "CFL-MGD: IFCA's cluster estimates with momentum (option II: local "
        "momentum steps; option I: averaged buffers)", f"{__name__}.cfl_mgd",
        host="CFLMGDDriver", hparams=CFL_MGD_OPTIONS,
        own_momentum="its momentum is --cfl_mgd_beta",
        # (A smaller lr: momentum carried across rounds by the cluster buffers
        # amplifies float32 rounding beyond the tolerance at lr 0.02 in this setting.)
        parity=({"num_groups": 3, "cfl_mgd_beta": 0.9, "_config": {"client_lr": 0.005}},
                {"num_groups": 3, "cfl_mgd_option": "gradient", "ifca_loss_batches": 2},
                {"num_groups": 2, "cfl_mgd_option": "gradient", "cfl_mgd_buffer": "server",
                 "grad_avg_norm": "members", "cfl_mgd_grad_batches": 0},
                # IFCA's initialisations: the forced and assign modes.
                {"num_groups": 3, "cfl_mgd_beta": 0.5, "ifca_init": "fedavg_warm",
                 "ifca_warm_rounds": 1, "ifca_forced_rounds": 2,
                 "_config": {"client_lr": 0.005}},
                {"num_groups": 2, "cfl_mgd_option": "gradient", "ifca_init": "good_init",
                 "ifca_eval": "test_loss"})),
)
