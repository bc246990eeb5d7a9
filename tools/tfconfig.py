"""Prints the build settings of the installed TensorFlow as Makefile assignments, so the
build imports TensorFlow once and takes every flag from tf.sysconfig."""

import os
import sysconfig

import tensorflow as tf

ducc = os.path.join(tf.sysconfig.get_include(), "external", "ducc", "src")
print("TF_CFLAGS := " + " ".join(tf.sysconfig.get_compile_flags()))
print("TF_LFLAGS := " + " ".join(tf.sysconfig.get_link_flags()))
print("TF_VERSION := " + tf.__version__)
print("DUCC_INC := -I" + ducc)
# Eigen's headers alone: the Makefile links this folder into an include folder of its own.
print("EIGEN_DIR := " + os.path.join(tf.sysconfig.get_include(), "Eigen"))
print("EXT_SUFFIX := " + sysconfig.get_config_var("EXT_SUFFIX"))
