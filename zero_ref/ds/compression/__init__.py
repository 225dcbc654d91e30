"""``deepspeed.compression``: the module-path helpers scripts import (``helper``); DeepSpeed's compression
methods are gone from DeepSpeed 0.19.8 too."""
