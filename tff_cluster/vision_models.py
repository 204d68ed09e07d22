"""Keras models of the federated image benchmarks TFF publishes: CIFAR-100 and CelebA.

TensorFlow is imported when a model is first built (`models.tf`), not with this
module. Every builder returns a built model (an `Input` fixes the shapes) with
logits out, for the library's `sparse_ce_logits` loss. The images arrive as
the data sets store them, float32 k/255 (`tff_cluster.data.compact.UNIT`);
whatever a model's source does to the pixels first is a layer of the model.

* `resnet18_gn`: the ResNet-18 with group normalization of Reddi et al.,
  "Adaptive Federated Optimization" (ICLR 2021), as TFF builds it:
  `create_resnet18` of tensorflow_federated/python/simulation/models/
  resnet_models.py (google-parfait/tensorflow-federated at
  6ac5ee389a86a483a0175b8b00fdc7faac221abb), behind the evaluation
  preprocessing of TFF's CIFAR-100 baseline (simulation/baselines/cifar100/
  image_classification_preprocessing.py, same commit): the central 24 x 24
  crop (`tf.image.resize_with_crop_or_pad`) and `per_image_standardization`
  of the 0..255 pixel values.
* `celeba_cnn`: LEAF's CelebA CNN (TalwalkarLab/leaf models/celeba/cnn.py at
  f69e081da0219101d00ccfe17e68d3d8b2bc0b3a).
"""

from __future__ import annotations

from typing import Tuple

from tff_cluster.models import tf

CIFAR_SHAPE = (32, 32, 3)
CROP = 24  # TFF's baseline DEFAULT_CROP_HEIGHT / _WIDTH, Reddi et al.'s crop size
CELEBA_SHAPE = (84, 84, 3)
RESNET18_STAGES = (64, 128, 256, 512)  # filters; two basic blocks each


def _standardize(x):
  # `tf.image.per_image_standardization` of the pixel values 0..255, as TFF's
  # baseline applies it to its uint8 images cast to float (k/255 * 255 is k
  # within float32 rounding).
  return tf.image.per_image_standardization(x * 255.0)


def _conv(filters: int, size: int, strides: int = 1):
  # TFF's convolutions: 'same' padding, no bias, He-normal kernels. (Its L2
  # weight decay of 1e-4 is left out: the runners' loss has no such term.)
  return tf.keras.layers.Conv2D(filters, size, strides=strides, padding="same",
                                use_bias=False, kernel_initializer="he_normal")


def _norm_relu(h):
  # Keras' GroupNormalization at its defaults (32 groups, epsilon 1e-3), as TFF's.
  h = tf.keras.layers.GroupNormalization()(h)
  return tf.keras.layers.Activation("relu")(h)


def _basic_block(h, filters: int, normalize_first: bool):
  """Pre-activation basic block: [GN, ReLU,] conv 3x3; GN, ReLU, conv 3x3;
  plus the input (through conv 1x1 + GN where the channels change)."""
  y = _conv(filters, 3)(_norm_relu(h) if normalize_first else h)
  y = _conv(filters, 3)(_norm_relu(y))
  shortcut = h
  if h.shape[-1] != filters:
    shortcut = tf.keras.layers.Conv2D(filters, 1, padding="valid", use_bias=False,
                                      kernel_initializer="he_normal")(h)
    shortcut = tf.keras.layers.GroupNormalization()(shortcut)
  return tf.keras.layers.add([shortcut, y])


def resnet18_gn(num_classes: int = 100, input_shape: Tuple[int, ...] = CIFAR_SHAPE,
                crop: int = CROP, name: str = "resnet18_gn") -> tf.keras.Model:
  """Reddi et al.'s CIFAR-100 model: ResNet-18 (v2, basic blocks) with group
  normalization, TFF's `create_resnet18(input_shape=(24, 24, 3))`, logits out.

  Layers: crop to the central `crop` x `crop` and standardize each image
  (TFF's baseline preprocessing, above); conv 7x7 64 stride 2, GN, ReLU;
  max-pool 3x3 stride 2; four stages of two basic blocks with 64, 128, 256
  and 512 filters; GN, ReLU; global average pooling; dense `num_classes`
  (initial kernel N(0, 0.01^2)). As in TFF's builder, no stage downsamples
  (it passes stride 1 to every block), so every stage works on 6 x 6 maps of
  a 24 x 24 crop. TFF's last layer is a softmax; here it gives the logits (the
  same loss through `sparse_ce_logits`). 11,227,812 parameters with 100
  classes, 11,186,772 with 20.
  """
  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32)
  h = inputs
  if crop and crop < input_shape[0]:
    top = (input_shape[0] - crop) // 2  # resize_with_crop_or_pad's offsets
    left = (input_shape[1] - crop) // 2
    h = tf.keras.layers.Cropping2D(((top, input_shape[0] - crop - top),
                                    (left, input_shape[1] - crop - left)))(h)
  h = tf.keras.layers.Lambda(_standardize, name="standardize")(h)
  h = _norm_relu(_conv(RESNET18_STAGES[0], 7, strides=2)(h))
  h = tf.keras.layers.MaxPool2D(3, strides=2, padding="same")(h)
  for stage, filters in enumerate(RESNET18_STAGES):
    for block in range(2):
      h = _basic_block(h, filters, normalize_first=(stage, block) != (0, 0))
  h = tf.keras.layers.GlobalAveragePooling2D()(_norm_relu(h))
  logits = tf.keras.layers.Dense(
      num_classes, kernel_initializer=tf.keras.initializers.RandomNormal(stddev=0.01),
      name="logits")(h)
  return tf.keras.Model(inputs, logits, name=name)


def celeba_cnn(num_classes: int = 2, input_shape: Tuple[int, ...] = CELEBA_SHAPE,
               name: str = "celeba_cnn") -> tf.keras.Model:
  """LEAF's CelebA CNN, logits out: four times conv 3x3 32 'same', batch
  normalization, max-pool 2 stride 2 'same', ReLU; flatten (6 x 6 x 32 =
  1,152); dense `num_classes` (2: smiling or not). 31,458 parameters, 256 of
  them BatchNorm's moving statistics.

  LEAF feeds the raw 0..255 pixel values: a `Rescaling(255)` layer first gives
  the model those values. LEAF's batch normalization always normalizes with
  the batch's statistics (`training=True`, at evaluation too); here, as
  Keras does, evaluation uses the moving averages.
  """
  inputs = tf.keras.Input(shape=input_shape, dtype=tf.float32)
  h = tf.keras.layers.Rescaling(255.0)(inputs)
  for _ in range(4):
    h = tf.keras.layers.Conv2D(32, 3, padding="same")(h)
    h = tf.keras.layers.BatchNormalization()(h)
    h = tf.keras.layers.MaxPool2D(2, strides=2, padding="same")(h)
    h = tf.keras.layers.ReLU()(h)
  h = tf.keras.layers.Flatten()(h)
  logits = tf.keras.layers.Dense(num_classes, name="logits")(h)
  return tf.keras.Model(inputs, logits, name=name)
