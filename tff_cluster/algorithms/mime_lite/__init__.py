"""MimeLite and Mime: local steps with the server's fixed momentum; Mime adds a control variate (`mime_lite.py`)."""

from tff_cluster.spec import hparams as hp
from tff_cluster.spec.algorithm import AlgorithmSpec

_MODULE = f"{__name__}.mime_lite"
_OWN_MOMENTUM = "its momentum is the server's, --mime_momentum"

MIME_MOMENTUM = hp.HParam("mime_momentum", float, 0.9, "beta of the base optimizer's (SGD "
                          "with momentum) server-held state.", low=0, high=1,
                          high_open=True, group="mime")
MIME_MOMENTUM_FORM = hp.HParam(
    "mime_momentum_form", str, "tff", "The base optimizer: tff (m <- beta m + g, step "
    "eta (beta m + g); TFF's SGDM) or paper ((1 - beta) g + beta m, the exponential "
    "average the Mime paper is cited for).", choices=("tff", "paper"), group="mime")
MIME_OPTIONS = (MIME_MOMENTUM, MIME_MOMENTUM_FORM, hp.SERVER_LR)

# (Small lr and beta: with 2 local epochs the fixed server momentum term
# raises the clients' local losses in this setting, on TFF's process as
# on ours, and the check below that the run trained would not hold.)
_PARITY = ({"mime_momentum": 0.2, "_config": {"client_lr": 0.005}},
           {"mime_momentum": 0.9, "mime_momentum_form": "paper",
            "_config": {"client_lr": 0.005}})

SPECS = (
    AlgorithmSpec("mime_lite", "MimeLite: local steps with the server's fixed momentum "
                  "(TFF's build_weighted_mime_lite with SGDM)", _MODULE,
                  host="MimeLiteDriver", hparams=MIME_OPTIONS, own_momentum=_OWN_MOMENTUM,
                  parity=_PARITY),
    AlgorithmSpec("mime", "Mime: MimeLite's steps with a control variate (an extra "
                  "exchange of full-batch gradients every round)", _MODULE,
                  host="MimeDriver", definition="mime_definition", hparams=MIME_OPTIONS,
                  own_momentum=_OWN_MOMENTUM, parity=_PARITY),
)
