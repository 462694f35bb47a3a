"""Which GPU to rent: the memory a model and method need, term by term (memory.py, from the
shapes in shape.py and the figures in provision/tables/fit.yaml), the cards that hold it at the
prices known (cards.py), what to change when none does (advice.py), and the extrapolation of
measured small-batch peaks (measure.py). Pure: nothing here touches a host.

Floor: beside money (it reads the datasheet table, the inventories' prices and the published
price reports).
"""
