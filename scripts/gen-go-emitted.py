#!/usr/bin/env python3
"""Generate crates/api/src/go_emitted.rs: for every type of upstream's k8s.io/api and
k8s.io/apimachinery meta/v1, the JSON fields Go's encoder always writes, with what it writes
for an unset one.

Go's encoding/json omits a field only when its tag says omitempty and its value is empty, and a
struct is never empty: a field of struct type (not a pointer) is always written, `{}` when
unset (or `null` for a zero metav1.Time, which marshals itself so). A field without omitempty is
always written too: "", 0, false, or null for a nil slice, map or pointer.

Usage: scripts/gen-go-emitted.py API_CHECKOUT APIMACHINERY_CHECKOUT TAG
  (git checkouts of github.com/kubernetes/api and github.com/kubernetes/apimachinery; TAG as
  v0.33.9). The output is checked in; the tests hold Skiff's objects against it.
"""

import re
import subprocess
import sys

BASIC = {
    "string": "EmptyString",
    "bool": "False",
    "byte": "Zero",
    "int": "Zero",
    "int32": "Zero",
    "int64": "Zero",
    "uint32": "Zero",
    "uint64": "Zero",
    "float32": "Zero",
    "float64": "Zero",
}

# Types that marshal themselves: what their zero value is written as.
CUSTOM = {
    ("io.k8s.apimachinery.pkg.apis.meta.v1", "Time"): "Null",
    ("io.k8s.apimachinery.pkg.apis.meta.v1", "MicroTime"): "Null",
    ("io.k8s.apimachinery.pkg.apis.meta.v1", "Duration"): "ZeroDuration",
    ("io.k8s.apimachinery.pkg.api.resource", "Quantity"): "ZeroQuantity",
    ("io.k8s.apimachinery.pkg.util.intstr", "IntOrString"): "Zero",
    ("io.k8s.apimachinery.pkg.runtime", "RawExtension"): "Null",
}

IMPORT_PREFIX = {
    "k8s.io/api/": "io.k8s.api.",
    "k8s.io/apimachinery/pkg/apis/meta/v1": "io.k8s.apimachinery.pkg.apis.meta.v1",
    "k8s.io/apimachinery/pkg/api/resource": "io.k8s.apimachinery.pkg.api.resource",
    "k8s.io/apimachinery/pkg/util/intstr": "io.k8s.apimachinery.pkg.util.intstr",
    "k8s.io/apimachinery/pkg/runtime": "io.k8s.apimachinery.pkg.runtime",
    "k8s.io/apimachinery/pkg/types": "io.k8s.apimachinery.pkg.types",
}


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def package_of(import_path):
    if import_path.startswith("k8s.io/api/"):
        return "io.k8s.api." + import_path[len("k8s.io/api/"):].replace("/", ".")
    return IMPORT_PREFIX.get(import_path)


FIELD = re.compile(r"^\t(?:(\w+)\s+)?(\S+)\s+`([^`]*)`")


def parse(text, package, structs, basics):
    imports = {}
    for alias, path in re.findall(r'^\s*(\w+)?\s*"(k8s\.io/[^"]+)"', text, re.M):
        name = alias or path.rsplit("/", 1)[-1]
        if package_of(path):
            imports[name] = package_of(path)
    for name, under in re.findall(r"^type (\w+) (string|bool|int32|int64|int|float64|byte)\s*$", text, re.M):
        basics[(package, name)] = BASIC[under]
    for m in re.finditer(r"^type (\w+) struct \{\n(.*?)^\}", text, re.M | re.S):
        fields = []
        for line in m.group(2).splitlines():
            f = FIELD.match(line)
            if not f:
                continue
            go_name, typ, tags = f.groups()
            tag = re.search(r'json:"([^"]*)"', tags)
            if not tag:
                continue
            parts = tag.group(1).split(",")
            if parts[0] == "-" or "inline" in parts[1:]:
                continue
            typ = typ.strip()
            if go_name is None:
                # An embedded type with a name in its tag.
                go_name, typ = typ.split(".")[-1], typ
            fields.append((parts[0] or go_name, typ, "omitempty" in parts[1:] or "omitzero" in parts[1:]))
        structs[(package, m.group(1))] = (fields, imports)


def resolve(typ, package, imports):
    """(package, name) of a named type, or None for builtins, pointers, slices and maps."""
    if typ.startswith(("*", "[]", "map[")):
        return None
    if "." in typ:
        alias, name = typ.split(".", 1)
        return (imports.get(alias), name)
    return (package, typ)


def zero_of(typ, package, imports, structs, basics):
    """What Go writes for an unset field of this type that is always written."""
    if typ.startswith(("*", "[]", "map[")) or typ == "interface{}":
        return "Null"
    if typ in BASIC:
        return BASIC[typ]
    key = resolve(typ, package, imports)
    if key in CUSTOM:
        return CUSTOM[key]
    if key in basics:
        return basics[key]
    if key in structs:
        return "Object"
    return None


def main():
    api, machinery, tag = sys.argv[1:4]
    structs, basics = {}, {}
    sources = []
    for path in git(api, "ls-tree", "-r", "--name-only", tag).split():
        if path.endswith("/types.go") and "/" in path:
            sources.append((api, path, "io.k8s.api." + path.rsplit("/", 1)[0].replace("/", ".")))
    for path, package in [
        ("pkg/apis/meta/v1/types.go", "io.k8s.apimachinery.pkg.apis.meta.v1"),
        ("pkg/apis/meta/v1/group_version.go", "io.k8s.apimachinery.pkg.apis.meta.v1"),
        ("pkg/apis/meta/v1/time.go", "io.k8s.apimachinery.pkg.apis.meta.v1"),
        ("pkg/apis/meta/v1/micro_time.go", "io.k8s.apimachinery.pkg.apis.meta.v1"),
        ("pkg/apis/meta/v1/duration.go", "io.k8s.apimachinery.pkg.apis.meta.v1"),
        ("pkg/runtime/types.go", "io.k8s.apimachinery.pkg.runtime"),
        ("pkg/api/resource/quantity.go", "io.k8s.apimachinery.pkg.api.resource"),
        ("pkg/util/intstr/intstr.go", "io.k8s.apimachinery.pkg.util.intstr"),
        ("pkg/types/namespacedname.go", "io.k8s.apimachinery.pkg.types"),
    ]:
        sources.append((machinery, path, package))
    for repo, path, package in sources:
        parse(git(repo, "show", f"{tag}:{path}"), package, structs, basics)

    out = {}
    for (package, name), (fields, imports) in sorted(structs.items()):
        if (package, name) in CUSTOM:
            continue
        emitted = []
        for json_name, typ, omitempty in fields:
            if omitempty:
                key = resolve(typ, package, imports)
                if key in CUSTOM:
                    emitted.append((json_name, CUSTOM[key]))
                elif key in structs:
                    emitted.append((json_name, "Object"))
                continue
            zero = zero_of(typ, package, imports, structs, basics)
            if zero is not None:
                emitted.append((json_name, zero))
        if emitted:
            out[f"{package}.{name}"] = emitted

    lines = [
        f"//! Generated by `scripts/gen-go-emitted.py` from k8s.io/api and k8s.io/apimachinery {tag}:",
        "//! do not edit. For each upstream type, the JSON fields Go's encoder always writes and what",
        "//! it writes for an unset one (see [`Zero`]).",
        "",
        "/// What Go writes for an always-written field that is unset.",
        "#[derive(Clone, Copy, Debug, PartialEq, Eq)]",
        "pub enum Zero {",
        "    /// A struct: `{}` with its own always-written fields.",
        "    Object,",
        "    /// A nil slice, map or pointer, or a zero `metav1.Time`: `null`.",
        "    Null,",
        '    /// `""`.',
        "    EmptyString,",
        "    /// `0`.",
        "    Zero,",
        "    /// `false`.",
        "    False,",
        '    /// A zero `resource.Quantity`: `"0"`.',
        "    ZeroQuantity,",
        '    /// A zero `metav1.Duration`: `"0s"`.',
        "    ZeroDuration,",
        "}",
        "",
        f'/// The upstream release the table was generated from.',
        f'pub const SOURCE: &str = "{tag}";',
        "",
        "/// Definition name (as the OpenAPI documents name it) to its always-written fields.",
        "pub static ALWAYS_WRITTEN: &[(&str, &[(&str, Zero)])] = &[",
    ]
    for definition, fields in sorted(out.items()):
        items = ", ".join(f'("{n}", Zero::{z})' for n, z in fields)
        lines.append(f'    ("{definition}", &[{items}]),')
    lines.append("];")
    lines.append("")
    sys.stdout.write("\n".join(lines))


if __name__ == "__main__":
    main()
