"""Operations: facts + desired state -> the steps still needed, each with its reason.

One module per part of the host: ``driver``, ``conda``, ``env``, ``torch`` (torch and the
recipe's packages), ``secrets``, ``validate`` (validation and the benchmark). ``step`` holds the
typed ``Step`` they all return, ``layout`` where conda and the env live. Nothing here touches a
host: ``plan`` calls these, ``bootstrap.apply`` runs what they return.
"""
