use compiler::passes::schedule_stream::{self, Lag};
#[test]
fn dbg() {
    let spec = std::env::var("DBG").unwrap_or("16,2,1,4,2".into());
    let v: Vec<u32> = spec.split(',').map(|x| x.parse().unwrap()).collect();
    let (n, d, h, m, g) = (v[0], v[1], v[2], v[3], v[4]);
    let p = compiler::problem::Problem {
        tokens: n,
        dim: d,
        heads: h,
        scale: 1.0 / f64::from(d).sqrt(),
        symmetric: false,
        shared_values: false,
        causal: true,
        softmax: runtime::layer::Softmax::Safe,
    };
    let lag = if g == 0 { Lag::Off } else { Lag::Steps(g) };
    let st = schedule_stream::run_with(&p, m, true, lag).unwrap();
    let man = compiler::stream::manifest("stream", &p, m, &st, "forced".into()).unwrap();
    if std::env::var_os("DBG_TEXT").is_some() {
        for q in &st.programs {
            eprintln!("{}", q.to_text());
        }
    }
    let proof = verifier::compact::prove_loops(&st.programs, &man, &verifier::Options::default());
    eprintln!("{proof}");
}
