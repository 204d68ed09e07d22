"""The contract every algorithm is written against (`definition.Definition`)
and the cluster maths several algorithms share (`cluster_ops`). Plain
TensorFlow; no runner, driver or registry imports."""
