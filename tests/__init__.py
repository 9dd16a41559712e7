"""The tests, a package that mirrors the tree: a test module is named by its path
(tests.train.test_engine), so two folders may hold files of one name."""
