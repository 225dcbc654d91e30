"""Clusters and models the simulator tests share."""
import sim


def cluster(gpu: str = "A100-80GB", world: int | None = None, *, nodes: int = 1, gpus_per_node: int = 8,
            **overrides) -> sim.Cluster:
    """A preset cluster of ``gpu``: ``world`` GPUs (``gpus_per_node`` to a node, fewer when the world is
    smaller), or ``nodes`` whole nodes; any link or memory field can be overridden."""
    if world is not None:
        gpus_per_node = min(gpus_per_node, world)
        nodes = max(1, world // gpus_per_node)
    return sim.Cluster.preset(gpu, nodes=nodes, gpus_per_node=gpus_per_node, **overrides)
