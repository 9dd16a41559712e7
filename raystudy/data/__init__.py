"""What a model trains and is tested on: the dataset registry (each entry with its download
source and the paper's splits), your own data, the tensor cache and batches, augmentation."""
