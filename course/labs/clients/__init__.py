"""Client scripts in the style of DeepSpeedExamples, run unchanged by either engine (``--engine``):
``classifier.py`` (cifar10's shape: argparse + add_config_arguments, a ds_config file, param groups, a
config scheduler, checkpoints with client_state) and ``pipeline.py`` (pipeline_parallelism's shape:
a PipelineModule of LayerSpecs, train_batch over a RepeatingLoader)."""
