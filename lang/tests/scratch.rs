#[test]
fn timing() {
    for n in [1000usize, 2000, 4000] {
        let braces = "{".repeat(n * 5);
        let layers = "layer a {".repeat(n);
        let fields = format!("layer a {{ {} }}", "tokens = 1; ".repeat(n));
        for (name, src) in [("braces", braces), ("layers", layers), ("fields", fields)] {
            let t = std::time::Instant::now();
            let p = lang::parse(0, &src);
            let t1 = t.elapsed();
            let r = lang::render("x", &src, &p.diagnostics);
            println!("{n} {name}: parse {:?} render {:?} ({} diags, {} bytes)", t1, t.elapsed() - t1, p.diagnostics.len(), r.len());
        }
    }
}
