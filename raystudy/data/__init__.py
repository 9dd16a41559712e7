"""What a model trains and is tested on: the dataset registry over its sources (a module each, in
``sources/``), the paper's splits and transforms, your own data, the tensor cache and batches, augmentation."""
