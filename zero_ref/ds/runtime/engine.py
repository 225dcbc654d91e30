"""``deepspeed.runtime.engine.DeepSpeedEngine``: the class ``initialize`` returns, for ``isinstance`` checks
(accelerate unwraps a model that is one; scripts test for it)."""
from zero_ref.ds.engine import Engine as DeepSpeedEngine

__all__ = ["DeepSpeedEngine"]
