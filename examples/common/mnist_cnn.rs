//! The MNIST CNN shared by the examples: two 3x3 convolutions (16 and 32 channels), each with
//! 2x2 max pooling and a ReLU, then a linear layer to the 10 classes (20,490 parameters).
//! ReLU after the pooling computes the same function as before it (both are monotone) on a
//! quarter of the elements.

use wgrad::nn::{Activation, Conv2d, Flatten, Linear, MaxPool2d, Sequential};
use wgrad::ops::Conv2dOpts;
use wgrad::{DType, Device, Result};

pub fn cnn(dev: &Device, dt: DType) -> Result<Sequential> {
    let same = Conv2dOpts {
        padding: (1, 1),
        ..Default::default()
    };
    Ok(Sequential::new()
        .add("conv1", Conv2d::new(dev, 1, 16, 3, same, dt)?)
        .add(
            "pool1",
            MaxPool2d {
                k: 2,
                stride: 2,
                padding: 0,
            },
        )
        .add("relu1", Activation::Relu)
        .add("conv2", Conv2d::new(dev, 16, 32, 3, same, dt)?)
        .add(
            "pool2",
            MaxPool2d {
                k: 2,
                stride: 2,
                padding: 0,
            },
        )
        .add("relu2", Activation::Relu)
        .add("flatten", Flatten)
        .add("fc", Linear::new(dev, 32 * 7 * 7, 10, true, dt)?))
}
