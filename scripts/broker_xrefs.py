#!/usr/bin/env python3
"""Count self.<name> uses in each broker part whose definition lives in another part, and
the BrokerCore stubs (methods declared in base.py) that no part implements."""
import ast, sys, collections
files = sys.argv[1:] or sorted(str(p) for p in __import__("pathlib").Path("ezra/broker").glob("*.py") if p.name != "__init__.py")
defs = {}   # name -> set(files)
uses = collections.defaultdict(list)
for f in files:
    tree = ast.parse(open(f).read())
    for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
        for n in cls.body:
            if isinstance(n, ast.FunctionDef):
                defs.setdefault(n.name, set()).add(f)
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                defs.setdefault(n.target.id, set()).add(f)
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Name): defs.setdefault(t.id, set()).add(f)
        for n in ast.walk(cls):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                if isinstance(n.ctx, ast.Store) and cls.name != "BrokerCore":
                    defs.setdefault(n.attr, set()).add(f)
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            uses[f].append(n.attr)
base = [f for f in files if f.endswith("base.py")]
undeclared = 0; total = 0
for f in files:
    cross = [a for a in uses[f] if a in defs and f not in defs[a]]
    hidden = [a for a in cross if not any(b in defs[a] for b in base)]
    total += len(cross); undeclared += len(hidden)
    print(f, "cross-file:", len(cross), "not declared in base:", len(hidden), sorted(set(hidden))[:40])
stubs = sorted(name for name, where in defs.items() if where == set(base)) if base else []
print("TOTAL cross-file", total, "undeclared", undeclared, "unimplemented stubs", len(stubs), stubs)
