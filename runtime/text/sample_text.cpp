#include "runtime/text/sample_text.h"

namespace tessera::text {

namespace {

// Written for this project. Kept varied on purpose: repeated words and fragments give the BPE
// trainer pairs to merge in each script, and code gives it indentation, brackets and operators.
constexpr std::string_view kSample = R"SAMPLE(The river town woke slowly. In the morning the baker opened his shop, the ferry
crossed the water twice, and the children walked to the school on the hill. Nobody in the
town was in a hurry, and nobody thought that was strange.

The teacher asked the class a question: "What is a number that is larger than every other
number?" The children thought about it. One of them said there is no such number, because you
can always add one. The teacher smiled and wrote the answer on the board. Then she asked
another question, and another, until the bell rang at twelve o'clock.

It's easy to forget how much work goes into a simple loaf of bread. The flour has to be milled,
the water has to be warm but not hot, and the dough has to rest. If you rush it, the bread will
be heavy; if you wait too long, it will be sour. The baker says that good bread is mostly
patience, and that patience is mostly a habit.

We measured the length of the bridge three times: 1024 meters, 1025 meters and 1023 meters.
The average was 1024 meters, which we wrote in the report. The report was 18 pages long and had
7 tables, 12 figures and 256 footnotes. Nobody read the footnotes, but they're there.

Learning a language is like learning to swim. You can read about it for years, but you only
learn it when you are in the water. Speak early, make mistakes, and listen carefully to the
people who speak it well. They'll correct you, and you'll remember the correction.

Weather report for the week: Monday will be sunny with a high of 24 degrees. Tuesday will be
cloudy, and rain is expected in the evening. Wednesday and Thursday will be windy. Friday will
be warm again, and the weekend will be perfect for a walk along the river.

A short guide to the town library. The library opens at nine in the morning and closes at six
in the evening, except on Sundays, when it is closed. Every reader may borrow up to five books
at a time for three weeks. Books that are returned late cost ten cents a day. The reading room
is on the second floor; please keep your voice down there. Children's books are on the first
floor, next to the window that looks over the river. If you cannot find a book, ask at the desk:
the librarians know where everything is, and they are happy to help.

Questions people often ask about the ferry. How long does the crossing take? About twenty
minutes when the water is calm, and a little longer when the wind is strong. Can I take my
bicycle? Yes, bicycles travel for free. Is there a ferry at night? The last ferry leaves at ten
in the evening; after that, you have to wait until the first one in the morning, at six.

The model reads the prompt one token at a time and writes the answer one token at a time. Each
token is a small piece of text: a word, part of a word, a number, or a piece of punctuation.
Common words become single tokens, while rare words are split into several smaller pieces.
The tokenizer learns which pieces to use by counting which pairs of symbols appear together
most often in a large amount of text, and merging the most common pairs first.

小镇的早晨总是很安静。面包师打开店门，渡船在河上来回两次，孩子们沿着小路走到山上的学校。
老师问大家一个问题：有没有一个比所有数都大的数？孩子们想了很久，有一个孩子说没有，因为
任何一个数都可以再加一。老师笑了，把答案写在黑板上。学习一门语言就像学习游泳，只读书是
不够的，你必须走进水里。多说，多听，不要怕犯错误。我们今天学习了新的词语，明天还要继续
学习。天气预报说明天是晴天，后天会下雨，周末的天气很好，适合去河边散步。这个模型可以
理解中文，也可以理解英文，还可以写代码。计算机科学是一门关于计算的科学，程序是写给人看
的，顺便给机器执行。

图书馆每天早上九点开门，晚上六点关门，星期天休息。每位读者一次最多可以借五本书，借期三周。
阅读室在二楼，请保持安静。儿童图书在一楼，靠近可以看到河的窗户。如果你找不到需要的书，可以
问服务台的工作人员，他们很乐意帮助你。渡船过河大约需要二十分钟，风大的时候会慢一点。自行车
可以免费上船。最后一班渡船晚上十点出发，第一班早上六点出发。模型一次读一个词元，也一次写一个
词元。常见的词语会成为一个词元，少见的词语会被分成几个更小的部分。

// A small ring buffer used by the streaming decoder.
#include <cstdint>
#include <vector>

template <typename T>
class RingBuffer {
 public:
  explicit RingBuffer(size_t capacity) : data_(capacity), head_(0), size_(0) {}

  bool push(const T& value) {
    if (size_ == data_.size()) return false;
    data_[(head_ + size_) % data_.size()] = value;
    ++size_;
    return true;
  }

  bool pop(T& value) {
    if (size_ == 0) return false;
    value = data_[head_];
    head_ = (head_ + 1) % data_.size();
    --size_;
    return true;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::vector<T> data_;
  size_t head_;
  size_t size_;
};

int count_words(const std::string& text) {
  int count = 0;
  bool in_word = false;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\t') {
      in_word = false;
    } else if (!in_word) {
      in_word = true;
      ++count;
    }
  }
  return count;
}

struct Token {
  int id;
  std::string text;
};

std::vector<Token> split_tokens(const std::string& text, const std::vector<std::string>& vocab) {
  std::vector<Token> tokens;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best_length = 1;
    int best_id = -1;
    for (size_t id = 0; id < vocab.size(); ++id) {
      const std::string& piece = vocab[id];
      if (piece.size() > best_length && text.compare(pos, piece.size(), piece) == 0) {
        best_length = piece.size();
        best_id = static_cast<int>(id);
      }
    }
    tokens.push_back({best_id, text.substr(pos, best_length)});
    pos += best_length;
  }
  return tokens;
}

class Library:
    def __init__(self, books):
        self.books = {book.title: book for book in books}
        self.loans = {}

    def borrow(self, reader, title):
        if title not in self.books:
            raise KeyError(f"no book called {title!r}")
        if title in self.loans:
            return False
        self.loans[title] = reader
        return True

    def give_back(self, title):
        return self.loans.pop(title, None)

def moving_average(values, window):
    """Return the moving average of values over the given window."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result


def count_tokens(lines):
    counts = {}
    for line in lines:
        for token in line.split():
            counts[token] = counts.get(token, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


if __name__ == "__main__":
    print(moving_average([1, 2, 3, 4, 5, 6], 3))
    print(count_tokens(["the cat sat", "the dog sat", "the end"]))
)SAMPLE";

}  // namespace

std::string_view bpe_training_sample() { return kSample; }

}  // namespace tessera::text
