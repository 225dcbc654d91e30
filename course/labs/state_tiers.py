"""One rank's model states per memory tier (GPU, CPU, NVMe), drawn as stacked bars."""
import matplotlib.pyplot as plt

from course.i18n import _

TIERS = (("gpu", "GPU"), ("cpu", "CPU"), ("nvme", "NVMe"))
CATEGORIES = (("params", "#4C72B0"), ("grads", "#DD8452"), ("optimizer", "#55A868"))


def tier_chart(tiers):
    """Stacked bars of parameters, gradients and optimizer states in GB (10⁹ bytes) on each tier; returns the axes.

    ``tiers`` maps "gpu", "cpu" and "nvme" to model-state bytes with ``params``, ``grads`` and ``optimizer``
    (``zero_ref.config.model_state_placement``).
    """
    fig, ax = plt.subplots(figsize=(6, 2.4))
    left = [0.0] * len(TIERS)
    for cat, color in CATEGORIES:
        widths = [getattr(tiers[t], cat) / 1e9 for t, _label in TIERS]
        ax.barh([label for _tier, label in TIERS], widths, left=left, color=color, label=_(cat))
        left = [a + w for a, w in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel(_("GB per rank (model states)"))
    ax.legend(fontsize=8, loc="lower right")
    plt.tight_layout()
    return ax
