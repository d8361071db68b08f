"""The ImageNet TFRecord format, the one copy: the source folder's scan (image_folder), the records written and
read back (tfrecords), generated sets (synthetic), and the conversion a leader runs where the images are (convert, the `tfrecords`
program). The operator converts here with the same modules (data/tfrecords.py)."""
