"""IFCA: K cluster models, each client picks the lowest-loss one and trains it."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

INIT_CHOICES = ("random", "good_init", "fedavg_warm", "kmeans_loss")
EVAL_CHOICES = ("assigned", "test_loss", "train_loss")
INIT_CLIENTS = hp.HParam(
    "ifca_init_clients", int, None, "kmeans_loss: the clients trained from one start whose "
    "models are the candidate centres (default --clients_per_round; FedJAX: the clients "
    "it is given).", low=1)

IFCA_OPTIONS = hp.grouped(
    "ifca",
    hp.NUM_GROUPS,
    hp.HParam("ifca_init", str, "random", "Cluster models' start: random (K independent "
              "draws), good_init (redraw until every cluster gets a share of a client "
              "sample, the authors' CIFAR code), fedavg_warm (a FedAvg-trained model "
              "with K random last layers, then forced random groups; their FEMNIST code) "
              "or kmeans_loss (k-means++ by loss over clients trained from one start: "
              "HypCluster's, FedJAX).",
              choices=INIT_CHOICES),
    INIT_CLIENTS,
    hp.HParam("ifca_init_dist", str, "keras", "Distribution of each of the K models' own "
              "draws (random, every good_init attempt, fedavg_warm's last layers): keras "
              "(the model's Keras initializers) or torch (every Dense and Conv2D kernel and "
              "bias uniform in +-1/sqrt(fan_in), PyTorch's default, the authors' MNIST code).",
              choices=("keras", "torch")),
    hp.HParam("ifca_warm_rounds", int, 20, "fedavg_warm: rounds of one-model training "
              "before round 1.", low=0, limit=hp.MAX_ROUNDS),
    hp.HParam("ifca_forced_rounds", int, 20, "fedavg_warm: first rounds whose clients are "
              "put into K random equal groups.", low=0, limit=hp.MAX_ROUNDS),
    hp.HParam("ifca_agg", str, "uniform", "Per-cluster averaging of the chosen clients' "
              "models: uniform (authors' MNIST/CIFAR code), num_examples (examples "
              "processed this round, their FEMNIST code) or samples (training samples, "
              "FedBase).", choices=("uniform", "num_examples", "samples")),
    hp.HParam("ifca_loss_batches", int, 0, "Batches of the round's local schedule the "
              "cluster estimate's loss is taken on (0 = every batch of the schedule: E "
              "passes over the training set with --local_epochs, the steps' batches with "
              "--local_steps; FedBase: 3; the rotated tasks: 1, their whole 100-image "
              "training set in one batch).", low=0,
              limit=hp.MAX_LOCAL_STEPS),
    hp.HParam("ifca_good_init_threshold", float, None, "good_init: the smallest share of "
              "the sample every cluster must get (default 0.35 for K = 2, 0.1 for K = 4, "
              "0.4/K otherwise).", low=0, high=1),
    hp.HParam("ifca_eval", str, "assigned", "Model a client with training data is tested "
              "with: assigned (the cluster its training loss chose when last sampled; a "
              "client never sampled takes the argmin of its training loss over the K "
              "models, untrained: FedBase's protocol), test_loss (the model of lowest "
              "loss on its own test data, IFCA's protocol for its test machines) or "
              "train_loss (every client the argmin of its training loss at evaluation: "
              "FedJAX's HypCluster evaluator). "
              "Test-only clients always choose by test loss.",
              choices=EVAL_CHOICES),
    # Each cluster's own server optimizer (state per cluster); sgd at 1.0 is
    # IFCA's mean.
    *hp.SERVER_OPTIMIZER_OPTIONS,
)

SPECS = (
    AlgorithmSpec(
        "ifca", "IFCA: K cluster models, clients pick the lowest-loss one and train it",
        f"{__name__}.ifca", host="IFCADriver", hparams=IFCA_OPTIONS,
        parity=({"num_groups": 3},
                {"num_groups": 2, "ifca_init": "good_init", "ifca_agg": "num_examples",
                 "ifca_loss_batches": 2},
                {"num_groups": 3, "ifca_init": "fedavg_warm", "ifca_warm_rounds": 2,
                 "ifca_forced_rounds": 2, "ifca_agg": "samples", "ifca_init_dist": "torch"},
                # A FedOpt step per cluster (its state stacked [K, ...]).
                {"num_groups": 2, "server_optimizer": "adam", "server_lr": 0.05,
                 "server_beta1": 0.5, "server_beta2": 0.9, "server_tau": 0.01})),
)
