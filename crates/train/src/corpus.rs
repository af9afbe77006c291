//! The prompt corpus for self-distillation: user requests assembled from
//! templates and fill-ins written here (deterministic for a seed, the same on
//! every machine). The target answers them; its answers are the training data.
//!
//! Nothing here comes from `../shared/bench`: a test checks that no prompt of
//! the corpus equals a benchmark prompt.

/// A small deterministic RNG (splitmix64) so the corpus depends only on the seed.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

/// The trainers' split of `n` sequences into training and held-out ids
/// (each held out with probability `holdout`, fixed by `seed`), and the
/// generator after it: training goes on drawing from it. Public so that
/// tools can find the held-out prompts of a data file
/// (`examples/heldout_prompts.rs`).
pub fn split_ids(n: usize, seed: u64, holdout: f32) -> (Vec<usize>, Vec<usize>, SplitMix) {
    let mut rng = SplitMix::new(seed ^ 0x5EED);
    let (mut train_ids, mut held) = (Vec::new(), Vec::new());
    for i in 0..n {
        if rng.f32() < holdout {
            held.push(i)
        } else {
            train_ids.push(i)
        }
    }
    (train_ids, held, rng)
}

/// First words of a user request, for target-written prompts
/// (`--prompt-openers`): the kinds of request people make of an assistant,
/// so the target's own requests cover questions, explanations, writing,
/// code, lists, rewriting, summaries and arithmetic instead of mostly
/// "I'm planning…". Written here, in no relation to any benchmark prompt.
pub const REQUEST_OPENERS: &[&str] = &[
    "What",
    "What is",
    "What are",
    "What does",
    "Why",
    "Why do",
    "How",
    "How do I",
    "How does",
    "How can I",
    "Explain",
    "Describe",
    "Tell me",
    "Who",
    "When",
    "Where",
    "Which",
    "Is it",
    "Should I",
    "Can you",
    "Write",
    "Write a",
    "Compose",
    "Draft",
    "Create",
    "Design",
    "Generate",
    "Give me",
    "Suggest",
    "Recommend",
    "List",
    "Name",
    "Outline",
    "Brainstorm",
    "Summarize",
    "Rewrite",
    "Paraphrase",
    "Translate",
    "Correct",
    "Convert",
    "Compare",
    "Define",
    "Classify",
    "Calculate",
    "Solve",
    "Estimate",
    "Find",
    "Fix",
    "Implement",
    "Please",
    "I need",
    "Help me",
];

const TOPICS: &[&str] = &[
    "volcanoes",
    "the water cycle",
    "photosynthesis",
    "the human heart",
    "honey bees",
    "the moon landing",
    "electric cars",
    "the printing press",
    "rainforests",
    "earthquakes",
    "the immune system",
    "coral reefs",
    "the Roman Empire",
    "ancient Egypt",
    "the Industrial Revolution",
    "solar panels",
    "wind turbines",
    "recycling",
    "the internet",
    "computer viruses",
    "machine learning",
    "the stock market",
    "inflation",
    "saving money",
    "time management",
    "learning a new language",
    "playing the guitar",
    "chess openings",
    "baking bread",
    "making coffee",
    "growing tomatoes",
    "keeping houseplants alive",
    "training a puppy",
    "caring for a cat",
    "running a marathon",
    "yoga",
    "sleep",
    "drinking enough water",
    "meditation",
    "public speaking",
    "job interviews",
    "writing a resume",
    "remote work",
    "team meetings",
    "customer service",
    "the French Revolution",
    "the Great Wall of China",
    "dinosaurs",
    "the ocean tides",
    "glaciers",
    "deserts",
    "the northern lights",
    "comets",
    "Mars",
    "Jupiter",
    "the speed of light",
    "gravity",
    "magnets",
    "electricity",
    "batteries",
    "the periodic table",
    "atoms",
    "DNA",
    "vaccines",
    "antibiotics",
    "nutrition",
    "vitamins",
    "the Olympic Games",
    "football",
    "basketball",
    "tennis",
    "cycling",
    "swimming",
    "hiking",
    "camping safety",
    "first aid",
    "fire safety",
    "budget travel",
    "packing a suitcase",
    "visiting Japan",
    "visiting Italy",
    "city planning",
    "public transport",
    "bridges",
    "skyscrapers",
    "clean energy",
    "climate change",
    "plastic pollution",
    "bird migration",
    "whales",
    "octopuses",
    "wolves",
    "elephants",
    "ants",
    "butterflies",
    "poetry",
    "mystery novels",
    "classical music",
    "jazz",
    "painting with watercolors",
    "photography",
    "film making",
    "video games",
    "board games",
    "smartphones",
    "password security",
    "backups",
    "spreadsheets",
    "databases",
    "operating systems",
    "compilers",
    "web browsers",
    "email etiquette",
    "open source software",
    "version control",
    "unit testing",
    "code review",
    "cloud computing",
    "3D printing",
    "robots",
    "drones",
    "the history of writing",
    "libraries",
    "museums",
    "school uniforms",
    "homework",
    "online courses",
    "friendship",
    "kindness",
    "moving to a new city",
    "cooking for a family",
    "vegetarian meals",
    "spices",
    "chocolate",
    "cheese making",
    "tea",
    "farming",
    "bees and pollination",
    "soil",
    "rivers",
    "lighthouses",
    "trains",
    "airplanes",
    "sailing",
    "submarines",
    "space stations",
    "telescopes",
    "calendars",
    "clocks",
];

const THINGS: &[&str] = &[
    "a lighthouse keeper",
    "a lost robot",
    "a curious fox",
    "an old clock",
    "a brave little boat",
    "a dragon who is afraid of fire",
    "a detective cat",
    "a forgotten library",
    "a snowman in summer",
    "a girl who can talk to trees",
    "a time traveler",
    "a baker in a small town",
    "two rival chess players",
    "a garden on the roof",
    "a map with a missing piece",
    "a shy astronaut",
    "a village without music",
    "a runaway kite",
    "a penguin who wants to fly",
    "a haunted bicycle",
];

const AUDIENCES: &[&str] =
    &["a five year old", "a high school student", "a busy parent", "a beginner", "an expert", "my grandmother", "a new employee"];

const LANGS: &[&str] = &["Python", "JavaScript", "Rust", "C", "Go", "Java", "TypeScript", "Ruby", "bash", "C++"];

const CODE_TASKS: &[&str] = &[
    "reverses a linked list",
    "counts the vowels in a string",
    "finds the largest number in a list",
    "merges two sorted lists",
    "checks whether a number is prime",
    "computes the factorial of n recursively",
    "converts Celsius to Fahrenheit",
    "reads a file and prints the number of words",
    "sorts a list of names alphabetically",
    "removes whitespace from both ends of a string",
    "returns the second smallest element of an array",
    "checks whether two strings are anagrams",
    "flattens a nested list",
    "computes the greatest common divisor of two numbers",
    "implements binary search",
    "parses a date string in the format YYYY-MM-DD",
    "counts how often each word appears in a text",
    "generates the first n square numbers",
    "validates an email address with a simple check",
    "computes the average of a list of floats",
    "transposes a matrix",
    "rotates an array by k positions",
    "capitalizes the first letter of every word",
    "finds duplicate files by size",
    "implements a stack with push and pop",
    "implements a queue using two stacks",
    "converts a number to binary",
    "sums the digits of an integer",
    "checks whether a year is a leap year",
    "returns the longest word in a sentence",
    "computes the dot product of two vectors",
    "clamps a value to a range",
];

const SQL_TASKS: &[&str] = &[
    "lists all employees hired after 2020",
    "counts orders per month",
    "finds products that were never ordered",
    "returns the average salary per department",
    "deletes duplicate rows from a table of emails",
    "finds the three most recent blog posts",
    "joins customers with their latest order",
    "counts users per country",
];

const TEXTS: &[&str] = &[
    "The library will close early on Friday because of the staff training. Books can still be returned in the drop box outside the main entrance, and the online catalog will remain available all weekend.",
    "Our team finished the first version of the app last week. Testing showed that the login page is slow on older phones, so the next sprint will focus on performance before we add new features.",
    "The farmers market moved to the school parking lot this summer. It opens at eight in the morning on Saturdays and now has twice as many stalls, including bread, honey, flowers and fresh fish.",
    "Scientists studying a small lake in the mountains found that its water temperature has risen by two degrees in twenty years. They believe the change affects the fish that live there.",
    "After three weeks of rain, the river rose above its banks and flooded several streets. Volunteers filled sandbags, and the town opened the sports hall as a shelter for families.",
    "The new bus line connects the train station with the hospital and the university. Buses run every ten minutes during the day and every half hour in the evening.",
    "Anna started running in January. At first she could only run for five minutes, but by June she finished her first ten kilometer race with her brother Leo cheering at the finish line.",
    "The museum is showing a collection of old maps. Some were drawn by sailors five hundred years ago and show islands that do not exist, and sea monsters near the edges of the known world.",
    "the meeting is moved to thursday at 3pm, please bring you're notes and the budget numbers from last quarter, we will discus the new office plan",
    "i has been learning to cook since last year and my favorite dish are pasta with tomato sauce, tomorrow i will tried to make bread for the first time",
];

const MATH: &[&str] = &[
    "What is {a} plus {b}?",
    "What is {a} times {c}? Show your work.",
    "What is {a} minus {b}?",
    "Divide {a0} by {c}. Show the steps.",
    "A box holds {c} apples. How many apples are in {d} boxes?",
    "A car drives at {c}0 km per hour for {d} hours. How far does it go?",
    "A book costs {c} dollars. How much do {d} books cost?",
    "What is {c} percent of {a0}?",
    "If I have {a} marbles and give away {c}, how many are left?",
    "What is the square of {c}?",
    "A rectangle is {c} meters long and {d} meters wide. What is its area and its perimeter?",
    "Tom is {c} years old. His sister is {d} years older. How old will she be in five years?",
    "Convert {a} minutes to hours and minutes.",
    "What is the average of {c}, {d} and {a}?",
    "A pizza is cut into {c} slices and {d} people share it equally. How many slices does each get, and how many are left?",
];

const LISTS: &[&str] = &[
    "List five facts about {topic}.",
    "Name six animals that live in {place}.",
    "List the months of the year.",
    "Name ten colors.",
    "List five fruits that are red.",
    "Name the continents of the world.",
    "Give me a list of eight common kitchen tools.",
    "List the numbers from {c} to {e} in words.",
    "Name five famous scientists and what they are known for.",
    "List seven things to check before a long drive.",
    "Name the days of the week in Spanish.",
    "List four tips about {topic}.",
    "Give me five words that rhyme with {word}.",
    "List the first ten prime numbers.",
    "Name five instruments in an orchestra.",
    "List six vegetables that grow underground.",
];

const PLACES: &[&str] = &["the ocean", "the desert", "the Arctic", "the jungle", "the mountains", "a city", "a pond", "Australia"];
const WORDS: &[&str] = &["cat", "light", "tree", "day", "sing", "moon", "rain", "book", "play", "green"];

const CHAT: &[&str] = &[
    "Tell me about {topic}.",
    "Explain {topic} to {aud}.",
    "What are the pros and cons of {topic}?",
    "Give me three tips about {topic}.",
    "Why does {topic} matter?",
    "Write a short paragraph about {topic}.",
    "What is a common misconception about {topic}?",
    "How would you describe {topic} in three sentences?",
    "What should a beginner know about {topic}?",
    "Write a short story about {thing}.",
    "Write a poem about {topic}.",
    "Write a haiku about {topic}.",
    "Describe a day in the life of {thing}.",
    "Write a friendly note to a neighbor about {topic}.",
    "Write a short product description for a book about {topic}.",
    "Give me a fun fact about {topic}.",
    "Compare {topic} and {topic2}.",
    "What questions would you ask an expert on {topic}?",
    "Write an email to my manager asking for a day off next week.",
    "Suggest a name for a cafe and explain why.",
    "Plan a simple three day trip to the coast.",
    "How do I say thank you politely in a formal letter?",
    "What is the history of {topic} in a few sentences?",
    "Give me a weekly plan for {topic}.",
];

const REWRITE: &[&str] = &[
    "Summarize this text in one sentence: {text}",
    "Summarize the main points of this paragraph: {text}",
    "Rewrite this text in a more formal tone: {text}",
    "Fix the spelling and grammar: {text}",
    "Turn this text into three bullet points: {text}",
    "Write a title for this text: {text}",
    "Extract all the places and people mentioned in this text: {text}",
    "Translate this text into simple English for a child: {text}",
];

/// Tasks on a piece of code found on the machine (`{code}`; `{lang}` is
/// another language).
const CODE_ON_TEXT: &[&str] = &[
    "Explain what this Python function does:\n\n{code}",
    "Add type annotations to this code and say briefly why each one fits:\n\n{code}",
    "Write a docstring for this function:\n\n{code}",
    "What could go wrong in this code? Suggest a fix.\n\n{code}",
    "Translate this Python code into {lang}:\n\n{code}",
    "Write two unit tests for this function:\n\n{code}",
    "Make this function shorter and easier to read, then list what you changed:\n\n{code}",
    "Add helpful comments to this code:\n\n{code}",
    "Review this code as a senior engineer would:\n\n{code}",
    "{code}\n\nWhat does the code above return, and when?",
];

/// Tasks on a passage of prose found on the machine (`{text}`).
const PROSE_ON_TEXT: &[&str] = &[
    "Summarize this passage in two sentences:\n\n{text}",
    "What is the main point of this text?\n\n{text}",
    "Explain this to someone who has never programmed:\n\n{text}",
    "Turn this into a short bulleted list:\n\n{text}",
    "Rewrite this paragraph in plain language:\n\n{text}",
    "Give this text a title and a one-line summary:\n\n{text}",
    "{text}\n\nSummarize the text above for a busy reader.",
    "Write three questions a student might ask after reading this:\n\n{text}",
];

/// Prompts built on text found on the machine: functions and docstrings
/// from the `.py` files under `dir` (meant for the Python standard library,
/// e.g. CPython 3.11.7's `lib/python3.11`), asked about with the tasks above.
/// Deterministic for the directory's contents and the seed: files are read
/// in sorted order and `site-packages`, caches and test suites are skipped,
/// so installed packages do not change the prompts.
pub fn text_prompts(dir: &std::path::Path, n: usize, seed: u64) -> std::io::Result<Vec<String>> {
    let mut files = Vec::new();
    collect_py(dir, &["site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"], &|_| false, &mut files)?;
    files.sort();
    let (mut code, mut prose) = (Vec::new(), Vec::new());
    for f in &files {
        let Ok(src) = std::fs::read_to_string(f) else { continue };
        extract_functions(&src, &mut code);
        extract_docstrings(&src, &mut prose);
    }
    if code.is_empty() || prose.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no Python functions or docstrings under {}", dir.display()),
        ));
    }
    let mut r = SplitMix::new(seed ^ 0x7465_7874_5F64_6972);
    let mut out = Vec::with_capacity(n);
    let mut seen = std::collections::HashSet::new();
    let mut tries = 0;
    while out.len() < n && tries < n * 20 {
        tries += 1;
        let p = if r.below(100) < 60 {
            let t = *r.pick(CODE_ON_TEXT);
            let lang = *r.pick(&LANGS[1..]);
            let c: &String = r.pick(&code);
            t.replace("{lang}", lang).replace("{code}", c)
        } else {
            let t = *r.pick(PROSE_ON_TEXT);
            let x: &String = r.pick(&prose);
            t.replace("{text}", x)
        };
        if seen.insert(p.clone()) {
            out.push(p);
        }
    }
    Ok(out)
}

/// Python files under `dir`, recursively, in directory order: hidden
/// directories and those named in `skip_dirs` are not entered, and files
/// whose name `skip_file` accepts are left out.
pub(crate) fn collect_py(
    dir: &std::path::Path,
    skip_dirs: &[&str],
    skip_file: &dyn Fn(&str) -> bool,
    out: &mut Vec<std::path::PathBuf>,
) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let path = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        let ft = e.file_type()?;
        if ft.is_dir() {
            if !skip_dirs.contains(&name.as_str()) && !name.starts_with('.') {
                collect_py(&path, skip_dirs, skip_file, out)?;
            }
        } else if ft.is_file() && name.ends_with(".py") && !skip_file(&name) {
            out.push(path);
        }
    }
    Ok(())
}

/// Top-level functions of 4–24 lines (docstrings included).
fn extract_functions(src: &str, out: &mut Vec<String>) {
    let lines: Vec<&str> = src.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with("def ") {
            let mut j = i + 1;
            while j < lines.len() && (lines[j].trim().is_empty() || lines[j].starts_with(' ') || lines[j].starts_with('\t')) {
                j += 1;
            }
            let mut end = j;
            while end > i && lines[end - 1].trim().is_empty() {
                end -= 1;
            }
            let body = &lines[i..end];
            if (4..=24).contains(&body.len()) && body.iter().all(|l| l.len() <= 100) {
                out.push(body.join("\n"));
            }
            i = j;
        } else {
            i += 1;
        }
    }
}

/// Triple-quoted blocks of 200–1,000 characters that read as prose (mostly
/// letters and spaces, no doctest examples).
fn extract_docstrings(src: &str, out: &mut Vec<String>) {
    let mut rest = src;
    while let Some(a) = rest.find("\"\"\"") {
        let after = &rest[a + 3..];
        let Some(b) = after.find("\"\"\"") else { break };
        let body = after[..b].trim();
        rest = &after[b + 3..];
        if !(200..=1000).contains(&body.len()) || body.contains(">>>") || body.contains('%') || body.contains("{") {
            continue;
        }
        let text: Vec<&str> = body.split_whitespace().collect();
        let text = text.join(" ");
        let plain = text.chars().filter(|c| c.is_alphabetic() || *c == ' ' || matches!(c, '.' | ',' | '\'')).count();
        if plain * 100 >= text.chars().count() * 92 {
            out.push(text);
        }
    }
}

fn fill(t: &str, r: &mut SplitMix) -> String {
    let a = 10 + r.below(990);
    let b = 1 + r.below(a);
    let c = 2 + r.below(18);
    let d = 2 + r.below(9);
    let e = c + 5 + r.below(10);
    let topic = *r.pick(TOPICS);
    let mut topic2 = *r.pick(TOPICS);
    if topic2 == topic {
        topic2 = TOPICS[(TOPICS.iter().position(|x| *x == topic).unwrap() + 1) % TOPICS.len()];
    }
    // drawn in this order, so that a seed gives the corpus it always gave
    let (thing, aud, place, word, text) = (*r.pick(THINGS), *r.pick(AUDIENCES), *r.pick(PLACES), *r.pick(WORDS), *r.pick(TEXTS));
    t.replace("{a0}", &(c * (a / c)).to_string())
        .replace("{a}", &a.to_string())
        .replace("{b}", &b.to_string())
        .replace("{c}", &c.to_string())
        .replace("{d}", &d.to_string())
        .replace("{e}", &e.to_string())
        .replace("{topic2}", topic2)
        .replace("{topic}", topic)
        .replace("{thing}", thing)
        .replace("{aud}", aud)
        .replace("{place}", place)
        .replace("{word}", word)
        .replace("{text}", text)
}

/// `n` user prompts, mixed over chat, code, rewrite/summarize, math and lists.
pub fn prompts(n: usize, seed: u64) -> Vec<String> {
    let mut r = SplitMix::new(seed);
    let mut out = Vec::with_capacity(n);
    let mut seen = std::collections::HashSet::new();
    let mut tries = 0;
    while out.len() < n && tries < n * 50 {
        tries += 1;
        let p = match r.below(100) {
            0..=34 => {
                let t = *r.pick(CHAT);
                fill(t, &mut r)
            }
            35..=54 => {
                let lang = *r.pick(LANGS);
                match r.below(5) {
                    0 => format!("Write a SQL query that {}.", r.pick(SQL_TASKS)),
                    1 => format!("Explain what a {lang} function that {} would look like, then write it.", r.pick(CODE_TASKS)),
                    _ => format!("Write a {lang} function that {}.", r.pick(CODE_TASKS)),
                }
            }
            55..=69 => {
                let t = *r.pick(REWRITE);
                fill(t, &mut r)
            }
            70..=84 => {
                let t = *r.pick(MATH);
                fill(t, &mut r)
            }
            _ => {
                let t = *r.pick(LISTS);
                fill(t, &mut r)
            }
        };
        if seen.insert(p.clone()) {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_distinct() {
        let a = prompts(300, 7);
        assert_eq!(a, prompts(300, 7));
        assert_eq!(a.len(), 300);
        assert_ne!(a, prompts(300, 8));
        assert!(a.iter().all(|p| !p.contains('{')), "unfilled template");
    }

    #[test]
    fn text_prompts_from_python_sources() {
        let dir = std::env::temp_dir().join(format!("tandem-corpus-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("site-packages")).unwrap();
        let module = "\"\"\"A small module that keeps a list of greetings and prints them in order, one line each, so that people who read the output can see who was greeted first and who was greeted last on a given day of the week.\"\"\"\n\ndef greet(names):\n    out = []\n    for n in names:\n        out.append('hello ' + n)\n    return out\n\ndef tiny():\n    pass\n";
        std::fs::write(dir.join("a.py"), module).unwrap();
        std::fs::write(dir.join("site-packages").join("b.py"), "def skipped(x):\n    y = x\n    z = y\n    return z\n").unwrap();
        let a = text_prompts(&dir, 20, 3).unwrap();
        assert_eq!(a, text_prompts(&dir, 20, 3).unwrap());
        assert!(!a.is_empty());
        assert!(a.iter().any(|p| p.contains("def greet(names):\n    out = []")), "{a:?}");
        assert!(a.iter().any(|p| p.contains("keeps a list of greetings")), "{a:?}");
        assert!(a.iter().all(|p| !p.contains("skipped") && !p.contains("def tiny") && !p.contains('{')));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(text_prompts(&dir, 5, 1).is_err());
    }

    /// The corpus must never contain a benchmark prompt.
    #[test]
    fn disjoint_from_bench_prompts() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/prompts-dev.jsonl");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let bench: Vec<String> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v.get("user").and_then(|u| u.as_str()).map(|s| s.trim().to_lowercase()))
            .collect();
        assert!(!bench.is_empty());
        for p in prompts(4000, 1) {
            let p = p.trim().to_lowercase();
            assert!(!bench.contains(&p), "corpus prompt equals a benchmark prompt: {p}");
        }
    }
}
