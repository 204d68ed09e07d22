"""Client-side maths: a client's batch schedule, local training on Keras models and on pure functions of the weights, optimizers as values, evaluation."""
