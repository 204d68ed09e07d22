"""What a run is made of, declared without TensorFlow: hyper-parameters, algorithm options, tasks."""
